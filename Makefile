# specops developer entry points. Every target works from a fresh clone:
# the venv is created and filled on first use.
PY_BOOT ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install prometheus kubectl test test-cluster lint fmt crds demo bench soak image clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{gsub(/\$$\$$/, "$$", $$2); printf "  %-14s %s\n", $$1, $$2}'

# Two distributions, both editable: the operator (pyproject.toml) with the test tools, and the local
# stack (local/pyproject.toml: emulated API server, simulated engines, demo, soak).
$(STAMP): pyproject.toml local/pyproject.toml local/hatch_build.py
	$(PY_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]' -e ./local
	touch $(STAMP)

install: $(STAMP) prometheus kubectl ## create .venv with the operator, the local stack and test tools, Prometheus and kubectl

prometheus: ## make sure Debian's prometheus is installed (apt-get when root)
	@scripts/ensure-prometheus.sh

kubectl: ## make sure Debian's kubectl is installed (apt-get when root)
	@scripts/ensure-kubectl.sh

# 3 workers on 2 cores: the end-to-end tests mostly wait on their simulated clusters' clocks
# (the closed-loop pair uses 17 % of a core), so more workers than cores shorten the wall time;
# at 4 the timing-sensitive tests (client-timed profiling, the demo's settled speedups) flaked
TEST_WORKERS ?= 3
test: install ## run the whole test suite (unit, component, end-to-end on the emulated cluster), TEST_WORKERS processes in parallel
	$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist worksteal --durations=30

test-cluster: install ## run the end-to-end tests against the cluster in $$KUBECONFIG
	$(PY) -m pytest tests/e2e -q --cluster

lint: $(STAMP) ## ruff, mypy, import-linter
	$(VENV)/bin/ruff check operator local tests
	$(VENV)/bin/ruff format --check operator local tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

fmt: $(STAMP) ## format and autofix
	$(VENV)/bin/ruff format operator local tests
	$(VENV)/bin/ruff check --fix operator local tests

crds: $(STAMP) ## regenerate crds/ (and the chart's copy) from the pydantic models
	$(PY) -m specops.api.crd crds/specops.dev_speculativedeployments.yaml charts/specops/crds/specops.dev_speculativedeployments.yaml

demo: install ## local demo (specops local demo): emulated cluster, simulated Triton pods, real Prometheus, the real operator, a timeline picture
	$(VENV)/bin/specops local demo

bench: install ## benchmarks: print tables and write JSON under bench-results/
	$(PY) -m specops.bench all --out bench-results
	$(VENV)/bin/specops local reaction --json bench-results/reaction.json

SOAK_SECONDS ?= 3600
soak: install ## chaos soak on the local stack, invariants checked every 2 s (SOAK_SECONDS=300 for CI); JSON in bench-results/soak.json
	$(VENV)/bin/specops local soak --seconds $(SOAK_SECONDS) --json bench-results/soak.json

IMAGE ?= specops:0.1.0
image: ## build the operator image $(IMAGE) from Dockerfile (needs docker or podman)
	@builder=$$(command -v docker || command -v podman) || { echo "error: make image needs docker or podman" >&2; exit 1; }; \
	  echo "$$builder build -t $(IMAGE) ."; $$builder build -t $(IMAGE) .

clean: ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache bench-results
