# kubeckpt — the two commands: `make demo` and `make test`. Everything they need is installed here.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
export PYTHONPATH := $(CURDIR)/hack$(if $(PYTHONPATH),:$(PYTHONPATH))
PYTEST_ARGS ?=

.PHONY: help venv binaries lint format test test-unit demo cluster-up cluster-down bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed (set PYTHON=python3.11)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { echo "python3 -m venv failed: apt-get install -y python3-venv"; exit 1; }
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP) ## create .venv with the dev and controller dependencies

binaries: ## build (or find cached) kube-apiserver, etcd, KWOK, training-operator under ~/.cache/kubeckpt
	bash hack/build-binaries.sh

lint: venv ## ruff check and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv ## apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: venv binaries lint ## everything: lint, unit tests, tests on the local control plane
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: venv ## only the tests that need no control plane
	$(PY) -m pytest -m "not cluster" $(PYTEST_ARGS)

demo: venv binaries ## the add-on on a local control plane: inject, train, preempt, resume (kubectl)
	$(PY) hack/demo.py $(DEMO_ARGS)

cluster-up: venv binaries ## start the local control plane in the background (.cluster/kubeconfig)
	$(PY) -m localcluster start

cluster-down: venv ## stop it
	$(PY) -m localcluster stop

bench: venv binaries ## control-plane start-up benchmark (figures go to docs/benchmarks.md)
	$(PY) hack/bench/cluster_start.py

clean: ## remove the venv and local state (the binary cache in ~/.cache/kubeckpt stays)
	rm -rf $(VENV) .cluster .pytest_cache .ruff_cache
