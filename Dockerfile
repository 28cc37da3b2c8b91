# The Tideshift services image: `tideshift run <service>`, `tideshift events tail`, ...
#
#   docker build -t ghcr.io/tideshift/tideshift:0.1.0 .
#   helm install tideshift charts/tideshift --set image.tag=0.1.0
#
# Stage 1 builds wheels (compilers stay there); stage 2 installs them into a slim runtime
# that runs as an unprivileged user and works with a read-only root filesystem.
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY events ./events
COPY services ./services
COPY loadgen ./loadgen
RUN pip wheel --wheel-dir /wheels .

FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp MPLCONFIGDIR=/tmp/matplotlib MPLBACKEND=Agg
COPY --from=build /wheels /wheels
RUN pip install --no-index --find-links=/wheels tideshift \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 tideshift \
    && useradd --system --uid 10001 --gid tideshift --home-dir /nonexistent \
       --shell /usr/sbin/nologin tideshift
# Numeric, so Kubernetes can verify runAsNonRoot without resolving names.
USER 10001:10001
# /healthz, /readyz and /metrics of every service.
EXPOSE 8080
ENTRYPOINT ["tideshift"]
CMD ["--help"]
