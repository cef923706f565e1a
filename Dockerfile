# loopguard in a container: docker build -t loopguard . &&
#   docker run --rm -p 4000:4000 -e LOOPGUARD_UPSTREAM=http://host.docker.internal:8080/v1 loopguard
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY config ./config
RUN pip install . && useradd --create-home --uid 10001 loopguard

USER loopguard
EXPOSE 4000
# Inside a container the proxy must listen on all interfaces; outside, the default is 127.0.0.1.
ENTRYPOINT ["loopguard", "serve", "--host", "0.0.0.0"]
CMD ["--config", "/app/config/loopguard.yaml"]
