# Debian's prometheus (2.42) as a local image, for machines that reach no container
# registry: docker/images.sh tags it with the name docker-compose.yml asks for (profile
# monitoring). Like the official image: /bin/prometheus (merged /usr) as the entrypoint,
# user nobody, data in /prometheus; wget for compose's healthcheck.
ARG DEBIAN_IMAGE=arbiter/base-debian:bookworm
FROM ${DEBIAN_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus wget \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && mkdir -p /prometheus /etc/prometheus && chown nobody:nogroup /prometheus
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
