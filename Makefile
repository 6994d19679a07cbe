# kubeckpt — the two commands: `make demo` and `make test`. Everything they need is installed here.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYPROJECT_SUM := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
STAMP := $(VENV)/.installed-$(PYPROJECT_SUM)
# The demo's venv: the controller extra only (the demo drives the cluster; torch, JAX and the
# test tools run in the images or in `make test`), minutes less on a first run.
DEMO_STAMP := $(VENV)/.installed-demo-$(PYPROJECT_SUM)
export PYTHONPATH := $(CURDIR)/hack$(if $(PYTHONPATH),:$(PYTHONPATH))
PYTEST_ARGS ?=
PREPARE_FOR ?= all
DEMO_ARGS ?=
# What `make demo` builds: the Kueue scenario needs Kueue too.
DEMO_FOR := $(if $(findstring --kueue,$(DEMO_ARGS)),demo-kueue,demo)

.PHONY: help venv venv-demo prepare binaries images lint format test test-unit test-lowest demo cluster-up cluster-down bench release clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed (set PYTHON=python3.11)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { echo "python3 -m venv failed: apt-get install -y python3-venv"; exit 1; }
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP) ## create .venv with the dev and controller dependencies

$(DEMO_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed (set PYTHON=python3.11)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { echo "python3 -m venv failed: apt-get install -y python3-venv"; exit 1; }
	@if [ -f $(STAMP) ]; then :; else $(PY) -m pip install -q --disable-pip-version-check -e '.[controller]'; fi
	@rm -f $(VENV)/.installed-demo-*; touch $@

venv-demo: $(DEMO_STAMP) ## create .venv with what `make demo` needs (the controller extra; `make venv` adds the rest)

binaries: ## build (or find cached) the control plane, KWOK, training-operator, kubelet, kube-proxy, CoreDNS
	bash hack/build-binaries.sh

images: ## build the real node's images without Docker (debootstrap + buildah; cached in ~/.cache/kubeckpt/images)
	@if [ "$$(id -u)" = 0 ]; then bash hack/images/build.sh >/dev/null; else \
	  echo "make images: not root, so no images and no real node (tests/node will say so)"; fi

lint: venv ## ruff check and format check; shellcheck of the scripts (hack/kind-e2e.sh is checked only so)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@command -v shellcheck >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null; } || \
	  { echo "shellcheck is needed: apt-get install -y shellcheck"; exit 1; }
	shellcheck -x hack/*.sh hack/images/*.sh .ci/run

format: venv ## apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

prepare: ## venv, binaries and images side by side, with progress (PREPARE_FOR=demo builds only what the demo starts)
	@$(PYTHON) hack/prepare.py --for $(PREPARE_FOR)

test: ## everything: lint, the lowest allowed versions, unit tests, tests on the local cluster and its real node
	@$(PYTHON) hack/prepare.py --for all
	$(MAKE) --no-print-directory lint test-lowest
	$(PY) -m pytest $(PYTEST_ARGS)

test-lowest: binaries ## the controller and CLI unit tests at the oldest dependency versions pyproject.toml allows
	bash hack/test-lowest-deps.sh

test-unit: venv ## only the tests that need no control plane
	$(PY) -m pytest -m "not cluster" $(PYTEST_ARGS)

demo: ## the add-on on a local cluster with a real node: inject, train, preempt, resume (DEMO_ARGS=--kueue: Kueue preempts; first run: see the README)
	@$(PYTHON) hack/prepare.py --for $(DEMO_FOR)
	KUBECKPT_BUILD_FOR=$(DEMO_FOR) $(PY) hack/demo.py $(DEMO_ARGS)

cluster-up: venv binaries images ## start the local cluster and its real node in the background (.cluster/kubeconfig; CLUSTER_ARGS=--kueue adds Kueue, --s3 an S3 server, "--real-nodes 2" a second real node)
	$(PY) -m localcluster start $(CLUSTER_ARGS)

cluster-down: venv ## stop it
	$(PY) -m localcluster stop

release: ## render the one-file install manifest dist/kubeckpt-<version>.yaml (IMAGE=registry/kubeckpt)
	bash hack/release.sh

bench: venv binaries ## control-plane start-up benchmark (figures go to docs/benchmarks.md)
	$(PY) hack/bench/cluster_start.py

clean: ## remove the venv and local state (the binary cache in ~/.cache/kubeckpt stays)
	rm -rf $(VENV) .cluster .pytest_cache .ruff_cache dist
