# loopguard in a container: docker build -t loopguard . &&
#   docker run --rm -p 127.0.0.1:4000:4000 --add-host=host.docker.internal:host-gateway \
#     -e LOOPGUARD_UPSTREAM=http://host.docker.internal:8080/v1 loopguard
# (--add-host: on Linux host.docker.internal exists only with it; Docker Desktop has it already.
# The model server must then listen on an address the container reaches, not only 127.0.0.1.)
# With a model server, Prometheus and Grafana: deploy/docker-compose.yml (docs/operations.md,
# "Deploy with docker compose").
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY config ./config
# The container's config: listen.host 0.0.0.0 is set there, explicitly (outside a container the
# default stays 127.0.0.1); the compose file mounts its own copy over it.
COPY deploy/config/loopguard.yaml /etc/loopguard/loopguard.yaml
RUN pip install . \
    && useradd --create-home --uid 10001 loopguard \
    && mkdir -p /var/lib/loopguard && chown loopguard /var/lib/loopguard

USER loopguard
EXPOSE 4000
VOLUME ["/var/lib/loopguard"]
ENTRYPOINT ["loopguard", "serve"]
CMD ["--config", "/etc/loopguard/loopguard.yaml"]
