# modelgate as an image: `docker build -t modelgate .`, then
# `docker run -p 8080:8080 modelgate` (the embedded defaults) or
# `docker run -v "$PWD/my.yaml:/etc/modelgate/gateway.yaml:ro" -p 8080:8080 modelgate -c /etc/modelgate/gateway.yaml`.
# The arguments after the image name replace the default CMD below, so a config of your own must
# listen on 0.0.0.0:8080 itself (server.listen) for the port mapping and the health check to reach it.

# The build stage installs the package the way the README does (a venv, then pip install of this
# repository), not editable: the runtime stage gets the finished venv and no source tree. With the
# s3 extra (boto3), so `plugins.url_delivery.store: s3` works in the image; never from a package
# index by name, where `modelgate` is someone else's project.
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# What `pip install '.[s3]'` reads: the project metadata (pyproject names README.md as its readme) and
# the packages it lists under [tool.setuptools.packages.find].
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY plugins ./plugins
COPY simulator ./simulator
RUN python -m venv /opt/modelgate && /opt/modelgate/bin/pip install '.[s3]'

FROM python:3.11-slim
# A fixed numeric uid, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
RUN groupadd --system --gid 10001 modelgate \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin modelgate
COPY --from=build /opt/modelgate /opt/modelgate
# The README's config.yaml (the embedded defaults written out): the default CMD serves it.
COPY config.yaml /etc/modelgate/config.yaml
# Bytecode was compiled at install time; nothing needs to write beside the code, so the root
# filesystem can be mounted read-only (the gateway's own scratch files go to /tmp).
ENV PATH=/opt/modelgate/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
# The admin listener (/metrics) is not exposed: config.yaml keeps it on the container's loopback
# (127.0.0.1:8081). A config for a stack with Prometheus sets admin_listen: "0.0.0.0:8081" and
# publishes it nowhere (deploy/README.md).
EXPOSE 8080
# The slim image has no curl: Python's urllib asks /readyz, and a non-2xx answer or no answer
# raises, which exits 1 (unhealthy). Failures in the start period (start-up) do not count.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=2)"]
ENTRYPOINT ["modelgate", "serve"]
# config.yaml listens on 127.0.0.1, which nothing outside the container reaches: --listen moves it.
CMD ["-c", "/etc/modelgate/config.yaml", "--listen", "0.0.0.0:8080"]
