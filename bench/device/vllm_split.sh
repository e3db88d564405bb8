#!/usr/bin/env bash
# Packs every wheel in WHL_DIR into one uncompressed tar and splits it into ROOT/pieceN/
# (vllm.tar.partN and a manifest: the piece count and the tar's sha256), PIECE bytes a piece
# at most (split's -b syntax, default 54M); bench/device/vllm_setup.sh joins them.
#   bash bench/device/vllm_split.sh WHL_DIR ROOT
set -euo pipefail
WHL=${1:?usage: vllm_split.sh WHL_DIR ROOT}
ROOT=${2:?usage: vllm_split.sh WHL_DIR ROOT}
rm -rf "$ROOT"/piece* "$ROOT/vllm.tar"
mkdir -p "$ROOT"
tar -cf "$ROOT/vllm.tar" -C "$WHL" .
SUM=$(sha256sum "$ROOT/vllm.tar" | cut -d' ' -f1)
split -b "${PIECE:-54M}" -d -a 2 "$ROOT/vllm.tar" "$ROOT/vllm.tar.part"
PARTS=("$ROOT"/vllm.tar.part*)
N=${#PARTS[@]}
for i in $(seq 1 "$N"); do
  mkdir -p "$ROOT/piece$i"
  mv "${PARTS[$((i - 1))]}" "$ROOT/piece$i/vllm.tar.part$i"
  printf 'pieces=%s\nsha256=%s\n' "$N" "$SUM" > "$ROOT/piece$i/manifest"
done
rm "$ROOT/vllm.tar"
echo "$N pieces of $(ls "$WHL" | wc -l) wheels; tar sha256 $SUM"
du -b "$ROOT"/piece*/vllm.tar.part* | awk '{printf "%s %.1f MiB\n", $2, $1 / 1048576}'
