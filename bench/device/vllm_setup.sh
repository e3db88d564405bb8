#!/usr/bin/env bash
# Device call, once per piece that bench/device/vllm_carry.sh built (carry [".carry/vllm/pieceN"]):
#   bash bench/device/vllm_setup.sh pieceN
# moves the carried piece into $PIECES (default /tmp/vllm_pieces, which stays on a warm machine
# between back-to-back calls). Once every piece named in the manifest is there, it joins them,
# checks the sha256, unpacks the wheels, installs them into $SITE (default /tmp/site) offline and
# without dependencies, and checks `import vllm`. A piece carried twice, or a call after the
# install, does no harm: the install runs once (the marker $SITE/.vllm-installed).
set -euo pipefail
cd "$(dirname "$0")/../.."
PIECE=${1:?usage: vllm_setup.sh pieceN}
SRC=${SRC:-.carry/vllm}/$PIECE
PIECES=${PIECES:-/tmp/vllm_pieces}
SITE=${SITE:-/tmp/site}
PY=${PY:-python3}
mkdir -p "$PIECES"
if [ -d "$SRC" ]; then
  mv -f "$SRC"/* "$PIECES"/
  rmdir "$SRC" 2>/dev/null || true
fi
[ -f "$PIECES/manifest" ] || { echo "no manifest: $SRC was not carried and no piece came before"; exit 1; }
N=$(sed -n 's/^pieces=//p' "$PIECES/manifest")
SUM=$(sed -n 's/^sha256=//p' "$PIECES/manifest")
have=()
for i in $(seq 1 "$N"); do [ -f "$PIECES/vllm.tar.part$i" ] && have+=("$i"); done
echo "pieces here: ${have[*]:-none} of $N"
[ -f "$SITE/.vllm-installed" ] && grep -qx "$SUM" "$SITE/.vllm-installed" && {
  echo "vLLM already installed in $SITE"; exit 0; }
[ "${#have[@]}" -eq "$N" ] || { echo "waiting for the other pieces (next call: the next piece)"; exit 0; }

parts=()
for i in $(seq 1 "$N"); do parts+=("$PIECES/vllm.tar.part$i"); done
got=$(cat "${parts[@]}" | sha256sum | cut -d' ' -f1)
[ "$got" = "$SUM" ] || { echo "joined pieces: sha256 $got, manifest says $SUM"; exit 1; }
WHL=$PIECES/whl
rm -rf "$WHL" && mkdir -p "$WHL"
cat "${parts[@]}" | tar -xf - -C "$WHL"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$WHL"/*.whl || { echo "wheel install failed"; exit 1; }
rm -rf "$WHL"
echo "$SUM" > "$SITE/.vllm-installed"
PYTHONPATH=$SITE "$PY" -c "import vllm; print('vllm', vllm.__version__, 'from', vllm.__file__)"
