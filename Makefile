# `make run`: set up and run the embedded default. `make test`: set up and run the test suite. `make lint`: ruff.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# the suite runs one worker per core (pytest-xdist; a test file stays in one worker): 2 on CI's 2 cores
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile

.PHONY: setup run test test-fast lint clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,slurm]'
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(PY) run.py $(ARGS)

test: setup
	WANDB_MODE=disabled WANDB_ERROR_REPORTING=false $(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

test-fast: setup  # everything but the tests marked slow: under 5 minutes on 2 cores
	WANDB_MODE=disabled WANDB_ERROR_REPORTING=false $(PY) -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) outputs multirun
