# The two commands a person needs: `make demo` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# mypy and import-linter read packages from directories, not through setuptools' editable
# finder: they see `tideshift` through this tree of symlinks to events/, services/, loadgen/.
LINT_ROOT := $(VENV)/lint-root

.PHONY: demo test test-fast test-real test-chaos docs lint install system-deps k8s-binaries image image-deps image-base

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev,forecast,report]'
	touch $(STAMP)

install: $(STAMP)

$(LINT_ROOT)/tideshift: $(STAMP)
	mkdir -p $@
	for folder in events services loadgen; do ln -sfn ../../../$$folder $@/$$folder; done

# Debian packages the tests start for real (Prometheus); skipped when already present.
system-deps:
	@command -v prometheus >/dev/null 2>&1 || { \
	  echo "installing Debian package: prometheus"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# Go-built Kubernetes control plane (etcd, apiserver, controller-manager, scheduler, kwok, helm),
# then the engines users run beside Tideshift (Kueue, the training operator, KubeRay).
k8s-binaries:
	bash tests/cluster/build.sh
	bash tests/cluster/build_engines.sh
	bash tests/cluster/real/build.sh

# The services image, built with podman (which builds the Dockerfile itself) where there is no
# Docker: `make image`. With Docker: `docker build -t tideshift:dev .`, and for the predictor
# `docker build --build-arg EXTRAS=forecast -t tideshift-predictor:dev .`.
IMAGE      ?= localhost/tideshift:dev
# The predictor's image: the same layers plus the `forecast` extra (scipy, statsmodels, ...).
PREDICTOR_IMAGE ?= localhost/tideshift-predictor:dev
# Docker Hub's python:3.11-slim when reachable (BASE_IMAGE=python:3.11-slim); by default a
# Debian 12 stand-in made with mmdebstrap, kept in podman's image store between runs.
LOCAL_BASE := localhost/tideshift-base:bookworm
BASE_IMAGE ?= $(LOCAL_BASE)
export CONTAINERS_CONF ?= $(CURDIR)/tests/image/containers.conf
# Opt-in, for networks behind a TLS-intercepting proxy: the host's CA bundle (the one in
# PIP_CERT) is mounted into the build's RUN steps only, never into the image.
BUILD_CA   ?= $(PIP_CERT)
CA_MOUNT   := $(if $(BUILD_CA),--volume $(BUILD_CA):/etc/ssl/certs/ca-certificates.crt:ro)
IMAGE_PKGS := podman buildah mmdebstrap runc uidmap fuse-overlayfs slirp4netns \
              containernetworking-plugins

# Debian packages that build and run the image; crun is left out (runc runs where it cannot).
image-deps:
	@command -v podman >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1 || { \
	  echo "installing Debian packages: $(IMAGE_PKGS)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    $(IMAGE_PKGS) >/dev/null; }

# A python:3.11-slim stand-in: Debian 12's Python 3.11 with a venv first on PATH (Debian's own
# pip refuses to install, PEP 668). The merged-usr hook keeps usrmerge and perl out (-50 MB).
image-base: image-deps
	@podman image exists $(LOCAL_BASE) || { \
	  set -e; tar=$$(mktemp --suffix=.tar); trap 'rm -f "$$tar"' EXIT; \
	  mmdebstrap --quiet --variant=minbase --mode=root \
	    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
	    --aptopt='APT::Install-Recommends "false"' \
	    --dpkgopt='path-exclude=/usr/share/doc/*' \
	    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
	    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
	    --dpkgopt='path-exclude=/usr/share/locale/*' \
	    --include=python3,python3-venv,passwd,ca-certificates \
	    --customize-hook='chroot "$$1" python3 -m venv /opt/venv' \
	    --customize-hook='rm -rf "$$1"/var/lib/apt/lists/* "$$1"/var/cache/apt/* "$$1"/var/log/*.log' \
	    bookworm "$$tar" http://deb.debian.org/debian; \
	  podman import --quiet \
	    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	    --change 'ENV LANG=C.UTF-8' \
	    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
	    --change 'CMD ["python3"]' "$$tar" $(LOCAL_BASE) >/dev/null; }

# Layers stay in podman's store: a rebuild after a source change redoes only the app wheel.
image: $(if $(filter $(LOCAL_BASE),$(BASE_IMAGE)),image-base,image-deps)
	podman build --quiet --network=host $(CA_MOUNT) --build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(IMAGE) .
	podman build --quiet --network=host $(CA_MOUNT) --build-arg BASE_IMAGE=$(BASE_IMAGE) \
	  --build-arg EXTRAS=forecast -t $(PREDICTOR_IMAGE) .
	@podman image ls --filter reference=$(IMAGE) --filter reference=$(PREDICTOR_IMAGE)

lint: $(STAMP) $(LINT_ROOT)/tideshift
	@# pytest imports test modules by basename (no __init__.py): two files of one name abort collection.
	@dupes=$$(find tests -name 'test_*.py' -printf '%f\n' | sort | uniq -d); \
	  [ -z "$$dupes" ] || { echo "rename: test file names must be unique under tests/: $$dupes"; exit 1; }
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	PYTHONPATH=$(LINT_ROOT) $(BIN)/lint-imports
	@# the documentation site: a dead link or a missing page fails (a stale generated reference
	@# page fails tests/unit/docs, in make test and make test-fast alike)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site

# Lint and tests both run, so one report shows every failure; either failing fails the target.
# OpenBLAS single-threaded, as `tideshift` itself runs it (services/cli.py): a fork (a test
# starting a server with a preexec_fn) shuts its thread pool down under a predictor fit in
# another thread, which then spins for ever in exec_blas (seen: pytest hung at exit in a
# Tidal fit; OpenBLAS #5520, numpy #30092).
test: $(STAMP) system-deps k8s-binaries image
	@status=0; \
	$(MAKE) --no-print-directory lint || status=1; \
	OPENBLAS_NUM_THREADS=1 $(BIN)/pytest -ra --durations=25 --ignore=tests/benchmarks || status=1; \
	exit $$status

# The real-cluster tier alone: real nodes (kubelet, containerd, kube-proxy, CoreDNS) in network
# namespaces the run creates; `make test` runs it too, with a 180 s compressed day instead of
# this whole one (REAL_DAY_SECONDS; REAL_DAY_OUT=docs/images redraws the docs' figure).
REAL_DAY_SECONDS ?= 720
test-real: $(STAMP) system-deps k8s-binaries image
	TIDESHIFT_REAL_DAY_SECONDS=$(REAL_DAY_SECONDS) TIDESHIFT_REAL_DAY_OUT=$(REAL_DAY_OUT) \
	  OPENBLAS_NUM_THREADS=1 $(BIN)/pytest -ra -m real tests/real

# The long chaos tier: leaders SIGKILLed every 30 s through a 15-minute run
# (tests/chaos/test_leaders_chaos.py) and the upgrade from the previous release's chart and
# code (tests/k8s/test_helm_upgrade.py, 4-7 minutes); `make test` runs a 150 s version of the
# first and skips the second (CI's budget).
test-chaos: $(STAMP) system-deps k8s-binaries
	TIDESHIFT_CHAOS_TIER=1 TIDESHIFT_CHAOS_LEADERS_SECONDS=$${TIDESHIFT_CHAOS_LEADERS_SECONDS:-900} \
	  OPENBLAS_NUM_THREADS=1 $(BIN)/pytest -ra -s -m chaos tests/chaos tests/k8s

# Unit tests and the services on the in-memory bus with a test clock: minutes, no servers.
test-fast: $(STAMP)
	OPENBLAS_NUM_THREADS=1 $(BIN)/pytest -q -m "not k8s and not prometheus and not slow" tests/unit

# The documentation site, regenerated reference pages included, served at localhost:8000.
docs: $(STAMP)
	$(BIN)/python docs/gen_reference.py
	$(BIN)/mkdocs serve

demo: $(STAMP)
	$(BIN)/tideshift demo --out demo-out
