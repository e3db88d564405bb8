#!/usr/bin/env bash
# `make compose-test`: docker compose for real, on a real engine, as a newcomer runs it.
#
#   1. engine      a Docker engine (docker/engine.sh: Debian's docker.io + compose v2), started
#                  here if none runs
#   2. images      make images (docker/images.sh): no registry needed
#   3. up          `docker compose up --wait` with no .env and no flags
#   4. score       a GSM8K group with gsm8k and gsm8k-diverse through the gateway; the code
#                  recipe into the sandbox container: HumanEval, assert and stdin/stdout groups
#                  (right 1.0, wrong 0.0) and hostile programs (sockets to Redis and the
#                  gateway, other processes' environment, the service's files, an infinite
#                  loop: 0.0 each), the stack healthy after them; episodes of the
#                  calculator and python environments through the gateway's /ors, and of
#                  every environment with the field's ORS clients (ors-sdk, openreward from
#                  .venv-ors, make ors-clients), unmodified, at the gateway's root
#   5. monitoring  Prometheus (profile monitoring) scraping the stack from here on
#   6. restart     `docker compose restart verify` while a client keeps scoring
#   7. auth        the one setting of a shared deployment (GATEWAY_KEYS_FILE): refused with a
#                  missing, placeholder or short secret; with a real one, keys from `arbiter
#                  keys`: 401 without, 200 with, 429 past a team's quota; auth stays on after
#   8. judge       profile cpu: the judge on vLLM's CPU image, with a tiny model from a mounted
#                  folder (python -m arbiter.tiny_model); then its server gone (connections
#                  refused) (COMPOSE_TEST_JUDGE=0 skips this phase)
#   9. events      a compat call and a verify worker stuck past its deadline, with Redis
#                  paused; a sandbox killed mid-job: the counters of the dashboard's fault panels
#  10. checks      only the gateway published (on 127.0.0.1); every query of the Grafana
#                  dashboard returns data from Prometheus
#  11. down        docker compose down -v; the engine stopped if this script started it
#
# Prints each phase's time. Cleans up on any exit: the compose project (containers,
# networks, volumes) and the engine it started; the images stay in the engine's store
# (/var/lib/docker) for the next run.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
# One compose test per machine at a time: two would share the engine (the first to finish
# stops the engine the other uses), the project name and the gateway's port 8000.
if [ -z "${ARBITER_COMPOSE_LOCKED:-}" ]; then
  echo "compose-test: waiting for /tmp/arbiter-compose-test.lock"
  exec env ARBITER_COMPOSE_LOCKED=1 flock /tmp/arbiter-compose-test.lock bash "$REPO/tests/compose/run.sh" "$@"
fi
export COMPOSE_PROJECT_NAME=arbiter-compose-test DOCKER_BUILDKIT=0
STATE=${ARBITER_ENGINE_DIR:-/tmp/arbiter-engine}
DATA=${ARBITER_DATA_DIR:-$REPO/../shared/data}
JUDGE=${COMPOSE_TEST_JUDGE:-1}
URL=http://127.0.0.1:8000
PROM=http://127.0.0.1:9090
PY=${PYTHON:-python3}
VENV_PY=$REPO/.venv/bin/python
mkdir -p "$STATE"
: >"$STATE/empty.env"
# No .env: a checkout's own .env (or a shell's ARBITER_*/GATEWAY_* variables) must not
# change what a newcomer's `docker compose up` does.
for v in $(compgen -e | grep -E '^(ARBITER_|GATEWAY_|VERIFY_|EMBEDDING_|JUDGE_|REDIS_URL$|COMPOSE_PROFILES$)' || true); do
  unset "$v"
done
compose() { docker compose --env-file "$STATE/empty.env" "$@"; }

declare -a TIMES=()
T0=$SECONDS
phase_start=$SECONDS
phase() {  # NAME: the previous phase ends, this one starts
  if [ -n "${PHASE:-}" ]; then TIMES+=("$(printf '%-11s %4d s' "$PHASE" $((SECONDS - phase_start)))"); fi
  PHASE=$1
  phase_start=$SECONDS
  echo "=== compose-test: $PHASE"
}

cleanup() {
  local rc=$?
  trap - EXIT
  if [ $rc -ne 0 ]; then
    echo "=== compose-test FAILED in phase ${PHASE:-?}; logs of the stack:"
    compose --profile '*' ps -a 2>/dev/null || true
    compose --profile '*' logs --no-color --tail 40 2>/dev/null || true
  fi
  if docker info >/dev/null 2>&1; then
    compose --profile "*" down -v --remove-orphans \
      >/dev/null 2>&1 || true
  fi
  [ "${STARTED_ENGINE:-0}" = 1 ] && { docker/engine.sh stop || true; }
  [ -z "${MODEL_DIR:-}" ] || rm -rf "$MODEL_DIR"
  [ -z "${KEYS_DIR:-}" ] || rm -rf "$KEYS_DIR"
  if [ -n "${PHASE:-}" ]; then TIMES+=("$(printf '%-11s %4d s' "$PHASE" $((SECONDS - phase_start)))"); fi
  echo "=== compose-test: phase times"
  printf '  %s\n' "${TIMES[@]}"
  printf '  %-11s %4d s\n' total $((SECONDS - T0))
  [ $rc -eq 0 ] && echo "=== compose-test passed" || echo "=== compose-test FAILED (exit $rc)"
  exit $rc
}
trap cleanup EXIT

phase engine
docker info >/dev/null 2>&1 || STARTED_ENGINE=1  # an engine running already stays running
docker/engine.sh start

phase images
docker/images.sh bases prometheus
if [ "$JUDGE" = 1 ]; then
  # the judge's image builds in the background until the judge phase needs it
  docker/images.sh vllm-cpu >"$STATE/vllm-cpu-image.log" 2>&1 &
  VLLM_BUILD=$!
fi
docker/images.sh  # = make images

phase up
# exactly the newcomer's command (plus --detach and --wait): no .env, no profile
compose up --detach --wait --wait-timeout 300
curl -fsS "$URL/readyz"
echo
gateway_log=$(compose logs --no-color gateway)  # (grep -q in a pipe would SIGPIPE compose)
grep -q "AUTH IS OFF" <<<"$gateway_log" || { echo "no auth-off banner in the gateway's log"; exit 1; }

phase score
"$PY" tests/compose/check.py score "$URL" "$DATA/gsm8k"
"$PY" tests/compose/check_sandbox.py score "$URL"
"$PY" tests/compose/check_envs.py "$URL"
ORS_PY=${ARBITER_ORS_PYTHON:-$REPO/.venv-ors/bin/python}
if [ -x "$ORS_PY" ]; then
  for client in ors-sdk openreward; do
    "$ORS_PY" tests/services/gateway/ors_clients.py "$client" "$URL" >/dev/null
  done
  echo "ors clients: ors-sdk and openreward ran every environment"
else
  echo "ors clients: skipped, no $ORS_PY (make ors-clients)"
fi

phase monitoring
compose --profile monitoring up --detach --wait --wait-timeout 120 prometheus

phase restart
"$PY" tests/compose/check.py restart "$URL" -- docker compose --env-file "$STATE/empty.env" restart verify

phase auth
# The shared deployment's one setting: GATEWAY_KEYS_FILE. A missing, placeholder or short
# secret stops the gateway; a real one serves keys made with it (`arbiter keys`), quotas on.
KEYS_DIR=$(mktemp -d)
chmod 755 "$KEYS_DIR"
SECRET=$("$PY" -c 'import secrets; print(secrets.token_hex(32))')
KEY=$(GATEWAY_KEY_SECRET=$SECRET "$REPO/.venv/bin/arbiter" keys create --team ci --file "$KEYS_DIR/keys.yaml")
LIMITED=$(GATEWAY_KEY_SECRET=$SECRET "$REPO/.venv/bin/arbiter" keys create --team limited \
  --responses-per-minute 10 --file "$KEYS_DIR/keys.yaml")
export ARBITER_KEYS_DIR=$KEYS_DIR GATEWAY_KEYS_FILE=/etc/arbiter/keys/keys.yaml
for secret in unset "" changeme-changeme; do
  if [ "$secret" = unset ]; then set -- env -u GATEWAY_KEY_SECRET; else set -- env GATEWAY_KEY_SECRET="$secret"; fi
  if out=$("$@" timeout 120 docker compose --env-file "$STATE/empty.env" run --rm --no-deps -T gateway 2>&1); then
    echo "the gateway started with auth on and secret '$secret'"; exit 1
  fi
  grep -q "GATEWAY_KEY_SECRET" <<<"$out" || { echo "$out" | tail -5; exit 1; }
  echo "  auth on, secret '$secret': the gateway refuses to start"
done
export GATEWAY_KEY_SECRET=$SECRET
compose up --detach --wait --wait-timeout 120 gateway
"$PY" tests/compose/check.py auth "$URL" "$KEY" "$LIMITED"
export ARBITER_API_KEY=$KEY  # every check from here on, as team ci

if [ "$JUDGE" = 1 ]; then
  phase judge
  wait "$VLLM_BUILD" || { cat "$STATE/vllm-cpu-image.log"; exit 1; }
  grep '\[images\]' "$STATE/vllm-cpu-image.log"
  MODEL_DIR=$(mktemp -d)
  "$VENV_PY" -m arbiter.tiny_model "$MODEL_DIR/judge" --data "$DATA/gsm8k" >/dev/null
  chmod -R a+rX "$MODEL_DIR"
  # the gateway is recreated with the judge's URL; vllm-cpu serves the mounted model
  export ARBITER_TEST_MODEL_DIR=$MODEL_DIR/judge JUDGE_MODEL=/models/judge \
    GATEWAY_JUDGE_URL=http://judge:8003 ARBITER_VLLM_CPU_DTYPE=float32 \
    ARBITER_VLLM_MAX_MODEL_LEN=1024 ARBITER_VLLM_CPU_KVCACHE_GB=1 ARBITER_VLLM_HF_HUB_OFFLINE=1
  judged() { compose -f docker-compose.yml -f tests/compose/judge.yml --profile cpu "$@"; }
  judged up --detach --wait --wait-timeout 420
  "$PY" tests/compose/check.py judge "$URL"
  judged stop vllm-cpu
  judged --profile judge-down up --detach vllm-refusing
  "$PY" tests/compose/check.py judge "$URL" --down
fi

phase events
# verify with a 2 s deadline and math-verify's own timeout past it: a stuck item holds its
# worker to the deadline, and the worker is replaced
VERIFY_DEADLINE_S=2 VERIFY_MATH_VERIFY_TIMEOUT_S=30 compose up --detach --wait verify
compose pause redis
"$PY" tests/compose/check.py events "$URL"
compose unpause redis
"$PY" tests/compose/check_sandbox.py kill "$URL" -- docker compose --env-file "$STATE/empty.env" \
  exec -T sandbox python -c "$("$PY" tests/compose/check_sandbox.py kill-script)"

phase checks
"$PY" tests/compose/check.py published "$COMPOSE_PROJECT_NAME"
if [ "$JUDGE" = 1 ]; then
  "$PY" tests/compose/check.py dashboard "$PROM"
else
  "$PY" tests/compose/check.py dashboard "$PROM" --no-judge
fi

phase down
compose --profile "*" down -v --remove-orphans
left=$(docker ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME")
[ -z "$left" ] || { echo "containers left after down: $left"; exit 1; }
