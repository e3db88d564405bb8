# A Python base built from Debian packages, for machines that reach no container registry:
# Debian's python3 (3.11), pip and `python` on top of the debootstrapped bookworm image
# (docker/images.sh). It stands in for python:3.11-slim-bookworm as the PYTHON_IMAGE of
# docker/Dockerfile and docker/vllm-cpu.Dockerfile. The host's extra CA certificates (those
# in the build context's ca-certificates/) are installed, so pip over HTTPS works where the
# host's does; pip installs system-wide, as in the slim image (no EXTERNALLY-MANAGED).
ARG DEBIAN_IMAGE=arbiter/base-debian:bookworm
FROM ${DEBIAN_IMAGE}
COPY ca-certificates/ /usr/local/share/ca-certificates/
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      ca-certificates python3 python3-pip python-is-python3 \
 && update-ca-certificates \
 && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
# Debian's pip reads the system CA bundle; a pip upgraded inside an image reads certifi's.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    LANG=C.UTF-8
CMD ["python3"]
