# The two commands a person needs: `make demo` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# mypy and import-linter read packages from directories, not through setuptools' editable
# finder: they see `tideshift` through this tree of symlinks to events/, services/, loadgen/.
LINT_ROOT := $(VENV)/lint-root

.PHONY: demo test lint install system-deps k8s-binaries

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev]'
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

# Go-built Kubernetes control plane (etcd, apiserver, controller-manager, scheduler, kwok, helm).
k8s-binaries:
	bash tests/cluster/build.sh

lint: $(STAMP) $(LINT_ROOT)/tideshift
	@# pytest imports test modules by basename (no __init__.py): two files of one name abort collection.
	@dupes=$$(find tests -name 'test_*.py' -printf '%f\n' | sort | uniq -d); \
	  [ -z "$$dupes" ] || { echo "rename: test file names must be unique under tests/: $$dupes"; exit 1; }
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	PYTHONPATH=$(LINT_ROOT) $(BIN)/lint-imports
	@# ruff, mypy and import-linter each repeat the pure-module list: all agree with pyproject's.
	$(BIN)/python .ci/check_pure_modules.py
	@# ruff has no length rule: no function over 60 lines, no module under services/ over 450.
	$(BIN)/python .ci/check_sizes.py

# Lint and tests both run, so one report shows every failure; either failing fails the target.
test: $(STAMP) system-deps k8s-binaries
	@status=0; \
	$(MAKE) --no-print-directory lint || status=1; \
	$(BIN)/pytest -ra --ignore=tests/benchmarks || status=1; \
	exit $$status

demo: $(STAMP)
	$(BIN)/tideshift demo --out demo-out
