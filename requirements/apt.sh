#!/usr/bin/env bash
# Install the Debian packages whose commands are missing: apt.sh COMMAND:PACKAGE ...
# As root, with apt-get; otherwise name what to install and fail (never half-way inside apt).
set -euo pipefail
missing=()
for pair in "$@"; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages: ${missing[*]}" >&2
  echo "install them first:  sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]} (apt)"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
