# Two commands set up a fresh machine (see README): `make run` and `make test`.
# Each creates the virtual environment it needs in .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU machines must pin torch==2.13.0 (a CPU build on local disk); anything else pulls a CUDA build.
STAMP := $(VENV)/.meshplan-installed

.PHONY: run test lint validate-report trace-report clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev,train,ui]'
	touch $(STAMP)

# The main job on built-in defaults: plan Llama 3.1 70B on 8 nodes of H100 SXM and write plan.yaml.
run: $(STAMP)
	$(BIN)/meshplan plan --model llama3-70b -o plan.yaml

# The whole test suite (lint first; slow tests included), on two workers (pytest-xdist, a file per worker at a
# time), then alone the tests that read a terminal's screen back frame by frame or drive a real browser (marked serial). As root,
# .ci/engines.sh first sets up and starts the real launch engines tests/engines drives (a one-node Slurm with
# sacct, Open MPI; seconds when already up).
# Not root, or when it fails outside CI: those tests skip, saying how to set them up; with CI=true they fail.
test: $(STAMP)
	@if [ "$$(id -u)" = 0 ]; then \
		echo "make test: setting up the real launch engines (.ci/engines.sh)"; \
		.ci/engines.sh || { [ "$${CI:-}" != true ] || exit 1; \
			echo "make test: WARNING: .ci/engines.sh failed; tests/engines will skip"; }; \
	else \
		echo "make test: not root, so .ci/engines.sh is not run; tests/engines skip where an engine is missing" \
			"(set up: sudo .ci/engines.sh)"; \
	fi
	@echo "make test: the real torchtitan 0.2.2 and 0.3.0 releases the export tests parse with (.ci/install-torchtitan.sh)"
	.ci/install-torchtitan.sh $(BIN)/python
	$(BIN)/ruff check .
	$(BIN)/pytest -q -n 2 --dist loadfile -m "not serial"
	$(BIN)/pytest -q -m serial

lint: $(STAMP)
	$(BIN)/ruff check .

# Regenerates the accuracy table in README.md from data/ground_truth/runs.csv (the published runs).
validate-report: $(STAMP)
	$(BIN)/python benchmarks/validate_report.py --write-readme

# Regenerates the trace-grid table in README.md (llama3-8b / 70b traced on this CPU; a few minutes).
trace-report: $(STAMP)
	$(BIN)/python benchmarks/trace_grid.py --write-readme

clean:
	rm -rf $(VENV) build *.egg-info
