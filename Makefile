# ddslurm developer entry points. `make help` lists them.
.DEFAULT_GOAL := help
SHELL := /bin/bash
export UV_PYTHON_DOWNLOADS := never
# Every Python process of the tests keeps its bytecode: where the shell sets PYTHONDONTWRITEBYTECODE (as some
# machines' images do), each of the suite's ~1,000 processes would compile ddslurm's modules again, and each pytest
# worker would rewrite every test module's asserts (10 CPU-s a worker instead of 3; docs/testing.md).
unexport PYTHONDONTWRITEBYTECODE
PKGS := config providers planner launcher runtime collector
UV ?= uv
# The Data Designer versions ddslurm supports (ddslurm.config.DATA_DESIGNER_VERSIONS, which the runtime's and the
# launcher's data-designer>=OLDEST,<UPPER repeat, UPPER the minor release after NEWEST's: 1.0.x while NEWEST is
# 1.0.0rc1, which pip and uv install only when asked for by its version); test-dd-range runs the node-side tests and
# the launcher's checks (doctor, the dry run, the recipe check) that use Data Designer (marked dd: the others, the
# proxy's, the gate's, the controller's, cannot tell its versions apart) against both, and the cluster test of other versions
# on the nodes (tests/test_e2e_dd_versions.py, whose NEWEST run is in make test) with OLDEST on the nodes and beside
# a launcher. tests/test_dd_cli.py checks that these places agree.
DD_OLDEST := 0.8.0
DD_NEWEST := 1.0.0rc1
DD_RANGE_TESTS := packages/runtime/tests tests/test_runtime_engine.py tests/test_fixed_seed_resume.py packages/launcher/tests/test_validation.py packages/launcher/tests/test_doctor.py

bootstrap: ## install uv (pip) if missing and sync the workspace
	@command -v $(UV) >/dev/null 2>&1 || python3 -m pip install --quiet 'uv==0.13.8'
	$(UV) sync --all-packages --locked

cluster: ## start the embedded local Slurm cluster (idempotent)
	tools/local-slurm start

# PORT=N (make demo PORT=8123): the port of the demo's local endpoint, for a host whose rules allow only some; a free
# one by default. Only a PORT given on make's command line counts (a PORT in the environment is some other server's).
DEMO_PORT := $(if $(filter command line,$(origin PORT)),$(PORT))

demo: bootstrap cluster ## end to end: local Slurm + local hosted endpoint + hosted-only example + collection (PORT=N: the endpoint's port)
	DEMO_PORT='$(DEMO_PORT)' tools/demo

demo-mixed: bootstrap cluster ## the mixed example: local generator (2 replicas on fake GPUs) + hosted judge (PORT=N as for demo)
	DEMO_PORT='$(DEMO_PORT)' tools/demo mixed

# make test: the whole suite on TEST_WORKERS pytest-xdist workers, the long tests (Slurm, then Data Designer) handed
# out first (tools/pytest_order.py), a few at a time as workers come free (--dist loadgroup: no worker is left alone
# at the end with a queue of long tests given to it at the start), every test of a module with a module-scoped
# fixture (a shared cluster run) on one worker, so that run happens once (--share-module-fixtures); the cluster
# tests mostly wait on Slurm, so three workers a core keep the CPUs busy (537 s at 6 against 578 s at 4, the same day). It ends by printing its wall time and
# CPU-seconds (tools/suite_times.py) and keeps every test's seconds in TEST_TIMES (tools/pytest_times.py):
# `make test-times` lists the slowest, and what its Slurm jobs spent (sacct, over the window make test records).
# docs/testing.md says how it is measured.
TEST_WORKERS ?= 6
TEST_TIMES ?= .test-times/durations.jsonl
TEST_WINDOW ?= .test-times/window.json
PYTEST_ARGS ?=

test: bootstrap cluster browser ## the whole suite, in parallel; prints its wall time and CPU-seconds at the end
	@python3 tools/suite_times.py run --label "make test" --window-file $(TEST_WINDOW) -- \
	  $(UV) run pytest -n $(TEST_WORKERS) --dist loadgroup -p tools.pytest_order --long-first --share-module-fixtures \
	  -p tools.pytest_times --times-file $(TEST_TIMES) $(PYTEST_ARGS)

test-times: ## the 30 slowest tests of the last make test, its seconds by marker and by file, its Slurm jobs' CPU
	@python3 tools/suite_times.py report --file $(TEST_TIMES) --top 30
	@echo
	@python3 tools/suite_times.py slurm --window-file $(TEST_WINDOW) --top 15 || echo "(no split of the Slurm jobs' CPU: see above)"

browser: ## Chromium and a font for the tests that render pages (Debian packages, installed as root when missing)
	tools/install-browser

lint: ## ruff lint + format check
	$(UV) run ruff check .
	$(UV) run ruff format --check .

TOOLS_PY := tools/gen_reference.py tools/mkdocs_hooks.py tools/import_contracts.py tests/test_docs.py \
  tools/suite_times.py tools/pytest_times.py tools/pytest_order.py tools/pytest_dd_audit.py tools/import_all.py tools/gpu_smoke

typecheck: ## mypy --strict over the packages (and the docs and import-contract tooling)
	$(UV) run mypy
	$(UV) run mypy $(TOOLS_PY)

imports: ## import-linter layering contracts
	$(UV) run lint-imports

lock-check: ## uv.lock up to date with the pyproject files
	$(UV) lock --check

docs: ## the docs site: the generated reference up to date, then mkdocs build --strict (into site/)
	$(UV) run python tools/gen_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(UV) run mkdocs build --strict --quiet

check: bootstrap lint typecheck imports lock-check docs test-isolated test ## what CI runs

# Data Designer is three distributions of one version: say which ones the run imports, and stop unless all are V.
DD_VERSIONS_PY := import sys, importlib.metadata as m; got = {d: m.version(d) for d in ("data-designer", "data-designer-config", "data-designer-engine")}; print(got); sys.exit(set(got.values()) != {sys.argv[1]})

test-dd-range: ## the node-side tests and the launcher's checks under the oldest and newest supported Data Designer, then a cluster run with the oldest on the nodes
	@for v in $(DD_OLDEST) $(DD_NEWEST); do \
	  echo "== data-designer $$v"; \
	  $(UV) run --with "data-designer==$$v" python -c '$(DD_VERSIONS_PY)' "$$v" && \
	  $(UV) run --with "data-designer==$$v" pytest -n auto --dist worksteal -p no:cacheprovider -m dd $(DD_RANGE_TESTS) || exit 1; \
	done
	@echo "== data-designer $(DD_OLDEST) on the nodes and beside a launcher, this workspace's beside another"
	DDSLURM_NODE_DD=$(DD_OLDEST) $(UV) run pytest -p no:cacheprovider tests/test_e2e_dd_versions.py

# test-python: the workspace synced from uv.lock into a fresh environment with another interpreter (PY, found through
# pyenv when it is installed, else as `uv --python PY` finds it; never downloaded), then the tests that can differ
# between interpreters: the packages' and the stand-in's tests that need no Slurm cluster (`-m "not slurm"`;
# PY_TESTS names other paths). The cross-package tests of tests/ (docs, the cluster scenarios, the oracle
# comparisons) run once, under the workspace's Python 3.11, in make test.
PY ?= 3.13
PY_TESTS ?= packages tools

test-python: ## the packages' tests that need no cluster under another Python, in its own environment: make test-python PY=3.13
	@V=$$(mktemp -d); trap 'rm -rf $$V' EXIT; \
	py=$$(pyenv prefix $(PY) 2>/dev/null)/bin/python$(PY); [ -x "$$py" ] || py=$(PY); \
	UV_PROJECT_ENVIRONMENT=$$V $(UV) sync --all-packages --locked --quiet --python "$$py" && \
	UV_PROJECT_ENVIRONMENT=$$V $(UV) run --no-sync python -VV && \
	UV_PROJECT_ENVIRONMENT=$$V $(UV) run --no-sync pytest -n auto --dist worksteal -p no:cacheprovider -m "not slurm" $(PY_TESTS)

test-%: ## one package's tests: make test-runtime
	$(UV) run pytest -n auto packages/$*/tests

test-isolated: $(addprefix test-isolated-,$(PKGS)) ## every package with ONLY its declared dependencies, one by one

# Each package in an environment of its own with only what it declares: every module imports, every console script
# answers --help (tools/import_all.py) and its smoke tests pass (the files marked `smoke`); the whole suite runs once,
# in `make test`.
test-isolated-%: ## one package with ONLY its declared dependencies installed: imports, --help, smoke tests
	@V=$$(mktemp -d); trap 'rm -rf $$V' EXIT; \
	UV_PROJECT_ENVIRONMENT=$$V $(UV) sync --package ddslurm-$* --locked --quiet && \
	UV_PROJECT_ENVIRONMENT=$$V $(UV) run --no-sync python tools/import_all.py ddslurm.$* ddslurm-$* && \
	UV_PROJECT_ENVIRONMENT=$$V $(UV) run --no-sync --with pytest \
	  pytest -q -p no:cacheprovider -m smoke packages/$*/tests

# gpu-smoke: ddslurm against a real vLLM on this machine's one GPU, in at most 8 minutes (tools/gpu_smoke; docs/serving.md,
# "GPU smoke test"). VLLM=path: the vLLM executable (default: vllm on PATH); MODEL=name: what it serves (default: a
# tiny random model made here, which needs transformers); GPU_SMOKE_ARGS: more options (--json, --keep DIR). Exit 0
# when every check passed, or when the machine has no GPU or no vLLM (it says "skipped"); 1 a check failed;
# 3 incomplete (checks skipped on a machine that could run them).
# Only values given on make's command line count (as PORT for demo): a MODEL in the environment is some other tool's.
SMOKE_VLLM := $(if $(filter command line,$(origin VLLM)),--vllm '$(VLLM)')
SMOKE_MODEL := $(if $(filter command line,$(origin MODEL)),--model '$(MODEL)')

gpu-smoke: ## the GPU smoke test against a real vLLM (VLLM=path MODEL=name); skips cleanly on a machine without a GPU
	$(UV) run python -m tools.gpu_smoke $(SMOKE_VLLM) $(SMOKE_MODEL) $(GPU_SMOKE_ARGS)

chaos: bootstrap cluster ## randomized, seeded fault campaign on the local cluster: make chaos [SEED=S] [N=10] [PARALLEL=3] [BUDGET=secs] [PROFILE=full|compact]
	@seed="$(SEED)"; seed="$${seed:-$$(( $$(date +%s) % 1000000 ))}"; profile="$(or $(PROFILE),full)"; \
	echo "chaos: SEED=$$seed (rerun the campaign: make chaos SEED=$$seed N=$(or $(N),10) PROFILE=$$profile; one scenario: uv run python -m tools.chaos --only SEED --profile $$profile)"; \
	$(UV) run python -m tools.chaos --seed "$$seed" --n $(or $(N),10) --parallel $(or $(PARALLEL),3) --profile "$$profile" $(if $(BUDGET),--budget-seconds $(BUDGET))

bench: bootstrap cluster ## benchmarks (ratios against a baseline measured in the same run)
	$(UV) run python bench/run.py

clean-work: ## remove the local workspace of runs
	rm -rf .ddslurm-work

help:
	@awk -F':.*## ' '/^[a-zA-Z%_-]+:.*## /{printf "  %-18s %s\n",$$1,$$2}' $(MAKEFILE_LIST)

.PHONY: bootstrap cluster browser demo demo-mixed test test-times test-isolated test-python chaos gpu-smoke test-dd-range lint typecheck imports lock-check docs check bench clean-work help
