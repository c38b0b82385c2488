# One entry point for set-up, tests, the default job and benchmarks.
# Everything installs into .venv from nothing; override versions on the command line:
#   make install TORCH_SPEC='torch==2.5.1' DEEPSPEED_SPEC='deepspeed==0.16.0'
#   make install TORCH_SPEC='torch==2.5.1' TORCH_PIP_ARGS='--index-url https://download.pytorch.org/whl/cu124'
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
DEEPSPEED_SPEC ?= deepspeed==0.19.8
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
PYTEST_ARGS ?=

.PHONY: install lint test test-unit test-gpu test-gpu-here run report plan bench bench-gpu-truth mutation clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	@echo "== installing into $(VENV): $(TORCH_SPEC), $(DEEPSPEED_SPEC), autotune and its extras (about a minute) =="
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel ninja
	# torch first, from TORCH_SPEC, so nothing below can pull a CUDA build.
	$(PIP) install -q "$(TORCH_SPEC)" $(TORCH_PIP_ARGS)
	# DeepSpeed compiles against the torch above: no build isolation.
	$(PIP) install -q --no-build-isolation "$(DEEPSPEED_SPEC)"
	$(PIP) install -q --no-build-isolation -e ".[train,deepspeed,export,test]"
	@echo "== installed =="
	touch $@

# ruff first (pyproject.toml's [tool.ruff]): a finding fails the suite before any test runs.
lint: install
	$(VENV)/bin/ruff check .

# Two workers (pytest-xdist), each test file whole on one: a file's session fixtures and its order stay its own.
test: lint
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=20 $(PYTEST_ARGS) --ignore=tests/gpu tests

# On a GPU machine (after `make install TORCH_SPEC=... TORCH_PIP_ARGS=...` with a CUDA build of torch):
# every CUDA path, summary in bench/results/gpu-<name>-<date>.md. Skips with "no CUDA device" elsewhere.
test-gpu: install
	$(PY) -m pytest -q $(PYTEST_ARGS) tests/gpu

# The same tier with a Python that already holds a CUDA build of torch and autotune's needs, on a
# machine that cannot download (e.g. a lent GPU box): make test-gpu-here GPU_PY=python3
GPU_PY ?= python3
test-gpu-here:
	TORCH_EXTENSIONS_DIR=$${TORCH_EXTENSIONS_DIR:-/tmp/autotune-ext} $(GPU_PY) -m pytest -q -rA $(PYTEST_ARGS) tests/gpu

test-unit: install
	$(PY) -m pytest -q $(PYTEST_ARGS) tests/unit

run: install
	./launch_distributed_training.sh --config configs/default_config.yaml

report: install
	$(PY) -m autotune.hardware report

bench: install
	$(PY) bench/run_all.py

# The planner scored against what an H100 measured (bench/gpu_truth): estimate error, planned vs fitting
# micro-batch, OOM, throughput against the best recorded setting, plan time; DeepSpeed ZeRO-1/2/3 too.
bench-gpu-truth: install
	$(PY) bench/score_gpu_truth.py --deepspeed

# Mutation testing of the pure core against tests/unit (config: [tool.mutmut] in pyproject.toml;
# scores in QUALITY.md). Not part of `make test`: about 2 hours on 2 cores.
mutation: install
	$(PIP) install -q "mutmut==3.8.1"
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children 2 || true
	$(PY) tools/mutation_report.py

clean:
	rm -rf $(VENV) runs wandb .pytest_cache mutants
