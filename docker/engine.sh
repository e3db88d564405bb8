#!/usr/bin/env bash
# A Docker engine for `make compose-test`, on a Debian bookworm host with no engine running.
#
#   docker/engine.sh start   # install what is missing, start dockerd (as root), wait for it
#   docker/engine.sh stop    # stop the dockerd that `start` started (by its PID), nothing else
#
# Installs, only where missing: Debian's docker.io (dockerd 20.10) with --no-install-recommends,
# and compose v2, which bookworm does not package: the static plugin inside trixie's
# docker-compose .deb, downloaded with a private apt state (the host's sources stay as they
# are) and copied into the Docker CLI's cli-plugins folder. There is no systemd: dockerd runs
# in the background, its log in $ARBITER_ENGINE_DIR/dockerd.log. If an engine already answers,
# `start` uses it and `stop` leaves it alone.
set -euo pipefail

STATE=${ARBITER_ENGINE_DIR:-/tmp/arbiter-engine}
PIDFILE=$STATE/dockerd.pid
PLUGINS=/usr/libexec/docker/cli-plugins
say() { echo "[engine] $*"; }

need_root() {
  [ "$(id -u)" = 0 ] || { say "run as root (dockerd and apt need it)"; exit 1; }
}

# The Debian mirror apt already uses (the first with a bookworm release), with a trailing /.
mirror() {
  apt-get indextargets --format '$(REPO_URI) $(RELEASE)' \
    | awk '$2 == "bookworm" {print $1; exit}'
}

install_engine() {
  if ! command -v dockerd >/dev/null; then
    say "installing docker.io (apt, --no-install-recommends)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      docker.io iptables >/dev/null
  fi
  if ! docker compose version >/dev/null 2>&1; then
    install_compose
  fi
}

# trixie's docker-compose package, fetched with its own apt state: nothing of trixie is added
# to the host's sources, lists or preferences.
install_compose() {
  local m tmp
  m=$(mirror)
  [ -n "$m" ] || { say "no bookworm mirror in apt's sources"; exit 1; }
  tmp=$(mktemp -d)
  say "compose v2: docker-compose from trixie on $m (private apt state in $tmp)"
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/etc/preferences.d"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${m} trixie main" >"$tmp/etc/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$tmp/etc/sources.list" -o "Dir::Etc::SourceParts=-"
    -o "Dir::Etc::Preferences=$tmp/etc/preferences" -o "Dir::Etc::PreferencesParts=$tmp/etc/preferences.d"
    -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o "Dir::State::status=/dev/null"
    -o "APT::Get::List-Cleanup=0" -o "APT::Sandbox::User=root")
  apt-get "${opts[@]}" update -qq
  (cd "$tmp" && apt-get "${opts[@]}" download docker-compose >/dev/null)
  dpkg -x "$tmp"/docker-compose_*.deb "$tmp/x"
  install -D -m 755 "$tmp/x/usr/libexec/docker/cli-plugins/docker-compose" "$PLUGINS/docker-compose"
  rm -rf "$tmp"
  docker compose version
}

start() {
  need_root
  mkdir -p "$STATE"
  if docker info >/dev/null 2>&1; then
    say "an engine already runs: using it (stop will leave it alone)"
    install_engine
    return
  fi
  install_engine
  # dockerd sets the FORWARD policy to DROP; stop puts back the one found here
  iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" {print $3; exit}' >"$STATE/forward-policy" || true
  say "starting dockerd (log: $STATE/dockerd.log)"
  dockerd >"$STATE/dockerd.log" 2>&1 &
  echo $! >"$PIDFILE"
  for _ in $(seq 1 120); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { tail -20 "$STATE/dockerd.log"; exit 1; }
    sleep 0.5
  done
  docker info --format 'dockerd {{.ServerVersion}}, storage {{.Driver}}, cgroup v{{.CgroupVersion}}'
}

stop() {
  [ -f "$PIDFILE" ] || { say "no engine started by this script"; return 0; }
  local pid
  pid=$(cat "$PIDFILE")
  if kill -0 "$pid" 2>/dev/null; then
    say "stopping dockerd (pid $pid)"
    kill "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { say "dockerd still runs after 30 s: SIGKILL"; kill -9 "$pid"; }
  fi
  rm -f "$PIDFILE"
  # dockerd leaves its bridge and the FORWARD policy it set (DROP) behind
  ip link delete docker0 2>/dev/null || true
  local policy
  policy=$(cat "$STATE/forward-policy" 2>/dev/null || true)
  [ -z "$policy" ] || iptables -P FORWARD "$policy" 2>/dev/null || true
  clean_iptables
}

# dockerd's rules and chains outlive it: the rules that jump to its chains or name its
# bridges (docker0, br-<id>), then its DOCKER* chains. Other rules stay as they are.
clean_iptables() {
  command -v iptables >/dev/null || return 0
  local table rule chain
  for table in filter nat; do
    iptables -t "$table" -S 2>/dev/null | grep -v '^-A DOCKER' \
      | grep -E '^-A .*(-j DOCKER| docker0| br-[0-9a-f]{12})' | sed 's/^-A /-D /' \
      | while read -r rule; do
        # shellcheck disable=SC2086 # a rule as iptables -S prints it: plain words
        iptables -t "$table" $rule 2>/dev/null || true
      done
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
      iptables -t "$table" -F "$chain" 2>/dev/null || true
    done
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
      iptables -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
