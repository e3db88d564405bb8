# Sourced by the GPU run scripts: install the carried wheels and name the card, or, with
# SMALL=1, run the same commands on a CPU with the anchor's tiny shapes.
if [ "${SMALL:-0}" != 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .carry/trainer/whl/*.whl || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
else
  export ANCHOR_SMALL=1
fi
