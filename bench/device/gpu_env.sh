# Sourced by the GPU run scripts: install the carried wheels and this checkout into /tmp/site,
# offline, and name the card; or, with SMALL=1, run the same commands on a CPU with the tiny
# shapes (PY=.venv/bin/python: the project's venv, whose editable install serves arbiter.*).
# WHL: the carried wheels (default .carry/trainer/whl; bench/device/prepare_carry.sh adds
# setuptools there, the only build dependency: the GPU machine has no index to reach).
WHL=${WHL:-.carry/trainer/whl}
if [ "${SMALL:-0}" != 1 ]; then
  site_install() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$@"
  }
  # every carried wheel but setuptools, which only builds the checkout (below): installed, it
  # would shadow the machine's own for torch and the rest
  site_install $(ls "$WHL"/*.whl | grep -v '/setuptools-') || { echo "wheel install failed"; exit 1; }
  # The checkout as the package `arbiter` (setup.py maps services/, trainer/, proto/ into it),
  # built in pip's isolated build environment from the carried setuptools wheel.
  site_install --find-links "$WHL" . || { echo "installing the checkout failed"; exit 1; }
  # /tmp/site's arbiter before the checkout's arbiter/ folder (the client and the CLI, without
  # services/ inside): PYTHONSAFEPATH keeps `python -m` (and its children) from putting the
  # working directory first; $PWD stays on the path for bench.
  export PYTHONPATH=/tmp/site:$PWD PYTHONSAFEPATH=1
  # the carried redis-server (prepare_carry.sh), for the runs that start Redis
  [ -x .carry/redis/bin/redis-server ] && export PATH=$PWD/.carry/redis/bin:$PATH
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
else
  export BENCH_SMALL=1
fi
