# Debian's redis-server (7.0) as a local image, for machines that reach no container
# registry: docker/images.sh tags it with the name docker-compose.yml asks for, so compose
# uses it and never pulls. Like the official image it runs as user redis in /data, and
# compose's command turns protected mode off (the official image's default).
ARG DEBIAN_IMAGE=arbiter/base-debian:bookworm
FROM ${DEBIAN_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no"]
