# The Tideshift services images: `tideshift run <service>`, `tideshift events tail`, ...
# Two from this file: the core image (watcher, planner, executor, the chart's jobs and test)
# and, with the `forecast` extra, the predictor's; they share the base and core layers.
#
#   docker build -t ghcr.io/tideshift/tideshift:0.1.0 .
#   docker build --build-arg EXTRAS=forecast -t ghcr.io/tideshift/tideshift-predictor:0.1.0 .
#   helm install tideshift charts/tideshift --set image.tag=0.1.0 \
#     --set predictor.image.repository=ghcr.io/tideshift/tideshift-predictor
#
# Without Docker Hub, `make image` builds both with podman from a Debian 12 stand-in base
# (mmdebstrap): --build-arg BASE_IMAGE=localhost/tideshift-base:bookworm.
#
# BASE_IMAGE: an image whose PATH has `python` (>= 3.11, for tomllib) and a `pip` allowed to
# install there (not Debian's externally-managed system pip), plus groupadd/useradd:
# python:3.11-slim, or the stand-in whose PATH starts with its venv, /opt/venv/bin.
ARG BASE_IMAGE=python:3.11-slim

# Stage 1 builds wheels (compilers stay there): first the dependencies, from pyproject.toml
# alone, so that a source (or README) change rebuilds only the small tideshift wheel. Both
# images' dependencies are resolved together (one set of versions), then split: /wheels/core
# (what the core dependencies need) and /wheels/forecast (what only the `forecast` extra adds).
FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml ./
# The resolved set, less statsforecast's distributed engine (fugue and what only it needs,
# pyarrow above all: 170 MB). The services use statsforecast.models only, which never imports
# it; statsforecast's __init__ does, and the final stage takes that import out (see there).
ARG DISTRIBUTED_ONLY="adagio fsspec fugue pyarrow triad"
RUN python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' > /core.txt \
    && python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["forecast"], sep="\n")' > /forecast.txt \
    && pip wheel --wheel-dir /wheels -r /core.txt -r /forecast.txt \
    && for name in $DISTRIBUTED_ONLY; do rm /wheels/"$name"-[0-9]*.whl; done \
    && pip install --dry-run --ignore-installed --no-index --find-links /wheels --quiet \
       --report /core.json -r /core.txt \
    && python -c 'import json, urllib.parse; print(*(urllib.parse.unquote(item["download_info"]["url"]).rsplit("/", 1)[1] for item in json.load(open("/core.json"))["install"]), sep="\n")' > /core-wheels.txt \
    && mkdir /wheels/core /wheels/forecast \
    && (cd /wheels && xargs -a /core-wheels.txt mv -t core && mv ./*.whl forecast/) \
    && (cd /wheels/core && sha256sum ./*.whl) > /core.sha256 \
    && (cd /wheels/forecast && sha256sum ./*.whl) > /forecast.sha256
COPY README.md ./
COPY events ./events
COPY services ./services
COPY loadgen ./loadgen
RUN pip wheel --no-deps --wheel-dir /dist .

# Stage 2: a slim runtime that runs as an unprivileged user on a read-only root filesystem.
# The plotting extra (`report`, matplotlib) is not installed: no service plots.
FROM ${BASE_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
# Two malloc arenas: the predictor's fitting threads otherwise each keep an arena of freed
# fit memory (measured, 60 tidal fits in 2 threads then freed: 263 MB RSS held, 205 MB with 2).
ENV MALLOC_ARENA_MAX=2
# The dependency wheels are bind-mounted, not COPYed (a COPY layer would keep ~190 MB of wheels
# even after `rm -rf`). Their checksums are COPYed first: Debian 12's podman/buildah (1.28)
# reuses a cached `RUN --mount=...,from=<stage>` layer even when that stage changed
# (containers/buildah#6609); the COPY makes the RUN's cache key follow the wheels.
# The packages' own test suites and kubernetes.aio (the services use the synchronous client)
# are deleted in the same layer, so they never take space.
# The wheels are installed as resolved in the build stage (--no-deps: fugue & co. are left
# out on purpose). This layer is the same in both images: EXTRAS is declared below it.
COPY --from=build /core.sha256 /usr/local/share/tideshift/
RUN --mount=type=bind,from=build,source=/wheels/core,target=/wheels \
    pip install --no-index --no-deps /wheels/*.whl \
    && site=$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \
    && find "$site" -depth -type d -name tests -exec rm -rf {} + \
    && rm -rf "$site/kubernetes/aio" \
    && groupadd --system --gid 10001 tideshift \
    && useradd --system --uid 10001 --gid tideshift --home-dir /nonexistent \
       --shell /usr/sbin/nologin tideshift
# EXTRAS: empty for the core image, `forecast` for the predictor's (the one extra built here).
# statsforecast's __init__ loses its two eager imports of the distributed engine (StatsForecast
# and its fugue backend, which the services never use): the grep fails the build if a new
# statsforecast changes them, the last import proves the models still load.
ARG EXTRAS=""
COPY --from=build /forecast.sha256 /usr/local/share/tideshift/
RUN --mount=type=bind,from=build,source=/wheels/forecast,target=/wheels \
    case "$EXTRAS" in \
      "") exit 0 ;; \
      forecast) ;; \
      *) echo "EXTRAS: expected nothing or 'forecast', got '$EXTRAS'" >&2; exit 1 ;; \
    esac \
    && pip install --no-index --no-deps /wheels/*.whl \
    && site=$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \
    && find "$site" -depth -type d -name tests -exec rm -rf {} + \
    && init="$site/statsforecast/__init__.py" \
    && grep -qx 'from .core import StatsForecast' "$init" \
    && grep -qx 'from .distributed import fugue  # noqa' "$init" \
    && sed -i -e '/^from .core import StatsForecast$/d' -e '/^from .distributed import fugue/d' "$init" \
    && python -m py_compile "$init" \
    && python -c 'from statsforecast.models import MSTL, AutoETS, AutoTheta'
# The application itself: one small wheel, the only layer a source change rebuilds.
COPY --from=build /dist/ /usr/local/share/tideshift/dist/
RUN pip install --no-index --no-deps /usr/local/share/tideshift/dist/*.whl
# Numeric, so Kubernetes can verify runAsNonRoot without resolving names.
USER 10001:10001
# /healthz, /readyz and /metrics of every service.
EXPOSE 8080
ENTRYPOINT ["tideshift"]
CMD ["--help"]
