# ddslurm developer entry points. `make help` lists them.
.DEFAULT_GOAL := help
SHELL := /bin/bash
export UV_PYTHON_DOWNLOADS := never
PKGS := config providers planner launcher runtime collector
UV ?= uv
# The Data Designer versions ddslurm-runtime accepts (packages/runtime/pyproject.toml: data-designer>=OLDEST,<UPPER,
# UPPER the minor release after NEWEST's: 1.0.x while NEWEST is 1.0.0rc1, which pip and uv install only when asked
# for by its version); test-dd-range runs the node-side tests against both. tests/test_dd_cli.py checks that the
# two places agree.
DD_OLDEST := 0.8.0
DD_NEWEST := 1.0.0rc1
DD_RANGE_TESTS := packages/runtime/tests tests/test_runtime_engine.py tests/test_fixed_seed_resume.py packages/launcher/tests/test_validation.py

bootstrap: ## install uv (pip) if missing and sync the workspace
	@command -v $(UV) >/dev/null 2>&1 || python3 -m pip install --quiet 'uv==0.13.8'
	$(UV) sync --all-packages --locked

cluster: ## start the embedded local Slurm cluster (idempotent)
	tools/local-slurm start

demo: bootstrap cluster ## end to end: local Slurm + local hosted endpoint + hosted-only example + collection
	tools/demo

demo-mixed: bootstrap cluster ## the mixed example: local generator (2 replicas on fake GPUs) + hosted judge
	tools/demo mixed

test: bootstrap cluster ## the whole suite, in parallel
	$(UV) run pytest -n auto --dist=loadgroup --durations=15

lint: ## ruff lint + format check
	$(UV) run ruff check .
	$(UV) run ruff format --check .

TOOLS_PY := tools/gen_reference.py tools/mkdocs_hooks.py tools/import_contracts.py tests/test_docs.py

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

test-dd-range: ## the node-side tests against the oldest and the newest Data Designer the runtime accepts
	@for v in $(DD_OLDEST) $(DD_NEWEST); do \
	  echo "== data-designer $$v"; \
	  $(UV) run --with "data-designer==$$v" python -c '$(DD_VERSIONS_PY)' "$$v" && \
	  $(UV) run --with "data-designer==$$v" pytest -n auto -p no:cacheprovider $(DD_RANGE_TESTS) || exit 1; \
	done

# test-python: the workspace synced from uv.lock into a fresh environment with another interpreter (PY, found through
# pyenv when it is installed, else as `uv --python PY` finds it; never downloaded), then every test that does not
# need the Slurm cluster (`-m "not slurm"`: the packages' tests and the cluster-free tests/ files; PY_TESTS narrows it
# to some paths). CI runs the whole suite under Python 3.11 (the workspace's .venv) and this under 3.13: 2636 tests,
# about 1270 CPU-seconds (measured under 3.13), so about 11 minutes on CI's 2 cores.
PY ?= 3.13
PY_TESTS ?=

test-python: ## the tests that need no cluster under another Python, in a separate environment: make test-python PY=3.13
	@V=$$(mktemp -d); trap 'rm -rf $$V' EXIT; \
	py=$$(pyenv prefix $(PY) 2>/dev/null)/bin/python$(PY); [ -x "$$py" ] || py=$(PY); \
	UV_PROJECT_ENVIRONMENT=$$V $(UV) sync --all-packages --locked --quiet --python "$$py" && \
	UV_PROJECT_ENVIRONMENT=$$V $(UV) run --no-sync python -VV && \
	UV_PROJECT_ENVIRONMENT=$$V $(UV) run --no-sync pytest -n auto -p no:cacheprovider -m "not slurm" $(PY_TESTS)

test-%: ## one package's tests: make test-runtime
	$(UV) run pytest -n auto packages/$*/tests

test-isolated: $(addprefix test-isolated-,$(PKGS)) ## every package with ONLY its declared dependencies, one by one

test-isolated-%: ## one package with ONLY its declared dependencies installed
	@V=$$(mktemp -d); trap 'rm -rf $$V' EXIT; \
	UV_PROJECT_ENVIRONMENT=$$V $(UV) sync --package ddslurm-$* --locked --quiet && \
	UV_PROJECT_ENVIRONMENT=$$V $(UV) run --no-sync --with pytest --with pytest-xdist \
	  pytest -n auto -p no:cacheprovider packages/$*/tests

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

.PHONY: bootstrap cluster demo demo-mixed test test-isolated test-python chaos test-dd-range lint typecheck imports lock-check docs check bench clean-work help
