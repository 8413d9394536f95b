# One virtual environment per checkout; every target installs what it needs first.
# TORCH_SPEC is installed before the project so that pip never pulls CUDA wheels on a CPU machine;
# on a GPU cluster use e.g. `make install TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"`.
PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.installed
PYTEST_ARGS ?=
# A pip constraints file that fixes every package's version, e.g. the CPU study's environment:
# `make install PIP_CONSTRAINTS=results/repro/environment.txt`.
PIP_CONSTRAINTS ?=
MUTATE_ARGS ?=

# The GPU check runs with the GPU machine's own Python and torch (never a venv, never a torch
# install): `make gpu-wheels` (here, with a package index) fills GPU_WHEELS with what a GPU image
# may lack, for the box's Python GPU_BOX_PYTHON only; on the GPU machine `make gpu-check OUT=DIR`
# installs that offline into GPU_SITE, proves it imports, runs, and writes everything into DIR as
# each section ends (default results/bench/gpu_<device>/; GPU_CHECK_ARGS=--bundle: report.md and
# check.tar.gz alone).
# GPU_PYTHON: this checkout's venv where there is one (a dev machine), else the machine's python3,
# which finds tools/ (scripts/gpu_check.py's logic) on PYTHONPATH.
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_WHEELS ?= gpu-wheels
GPU_BOX_PYTHON ?= 3.12
GPU_SITE   ?= .gpu-site
OUT        ?=
GPU_CHECK_ARGS ?=
GPU_ENV    := PYTHONPATH=$(CURDIR)/$(GPU_SITE):$(CURDIR)

.PHONY: install demo test test-all test-gpu gpu-wheels gpu-deps gpu-check mutate bench lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[train,dev,fused,finetune]" $(if $(PIP_CONSTRAINTS),-c $(PIP_CONSTRAINTS))
	$(PY) -c "import foam.fused as f; print('fused FOAM CPU kernel built:', f.kernel_available('cpu'))"
	touch $(STAMP)

demo: install
	$(PY) scripts/demo.py

# The suite's files are shared among PYTEST_WORKERS processes (pytest-xdist; CI has 2 cores), all
# of a file's tests in one of them, so that its module fixtures are built once.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadfile

test: install
	$(PY) -m pytest -q $(XDIST) -m "not slow and not gpu" $(PYTEST_ARGS)

test-all: install
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

test-gpu: gpu-deps
	$(GPU_ENV) $(GPU_PYTHON) -m pytest -q -m gpu tests/test_gpu.py $(PYTEST_ARGS)

gpu-wheels: install
	$(PY) scripts/gpu_check.py wheels --dest $(GPU_WHEELS) --box-python $(GPU_BOX_PYTHON)

gpu-deps:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) scripts/gpu_check.py install --wheels $(GPU_WHEELS) --target $(GPU_SITE) --python $(GPU_PYTHON)

# At most 8 minutes on one GPU (CPU at tiny sizes without one); writes OUT/report.md, the
# benchmarks' reports, the runs and every step's output, each as its section ends.
gpu-check: gpu-deps
	$(GPU_ENV) $(GPU_PYTHON) scripts/gpu_check.py run $(if $(OUT),--out $(OUT)) $(GPU_CHECK_ARGS)

# Mutation testing of the optimizer, loss, evaluation, schedule and checkpoint modules (about an
# hour on 2 cores); MUTATE_ARGS="foam/schedule.py" for one module, "--list" to see the mutants.
mutate: install
	$(PY) scripts/mutate.py $(MUTATE_ARGS)

bench: install
	$(PY) scripts/bench_optim.py
	$(PY) scripts/bench_train.py
	$(PY) scripts/bench_train.py --compile --optimizers adamw_fused foam2
	$(PY) scripts/bench_data.py

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache $(GPU_SITE)
