# Set-up and checks from a fresh clone with only Python 3.11 and pip.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install demo test bench clean constraints

$(BIN)/attntrace: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch pinned to one release. Which build that is depends on the index: PyPI's torch==2.13.0 for Linux is
	# the CUDA build (several GB); this project's machines find the CPU wheel on disk. For the CPU build
	# elsewhere: make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
	$(BIN)/pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	# constraints.txt pins every other package of the dev and test set: without it pip backtracks for ~2 min
	# through aiobotocore/s3fs/boto3 releases. Refresh it with `make constraints`.
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,capture,html,test-remote]'
	# Bytecode for the editable package: where PYTHONDONTWRITEBYTECODE is set, every run would compile it again.
	$(BIN)/python -m compileall -q attntrace
	touch $@

install: $(BIN)/attntrace

# The light demo: attntrace alone in a venv of its own (lint needs no torch, moto, dask or plotly), then the
# README's short demo. Reinstalled when the package's files change.
DEMO_VENV ?= .venv-demo
DEMO_BIN := $(DEMO_VENV)/bin
DEMO_TRACES := sample_traces/bf16_causal_fwd/naive.pt.trace.json.gz sample_traces/bf16_causal_fwd/sdpa_math.pt.trace.json.gz

# The venv gets no pip of its own (ensurepip took 16 s of a fresh machine's demo): this Python's pip (22.3 or
# later, for --python) installs into it.
$(DEMO_BIN)/attntrace: pyproject.toml $(shell find attntrace rules -type f -not -name '*.pyc')
	$(PYTHON) -m venv --clear --without-pip $(DEMO_VENV)
	$(PYTHON) -m pip --python $(DEMO_BIN)/python install -q -c constraints.txt .
	touch $@

demo: $(DEMO_BIN)/attntrace
	$(DEMO_BIN)/attntrace lint $(DEMO_TRACES) --fail-on never

test: install
	$(BIN)/ruff check .
	$(BIN)/pytest -q -n auto --maxprocesses 4

bench: install
	$(BIN)/python bench/bench_read.py

# Pins of today's newest releases that satisfy pyproject.toml, from a venv made without constraints.
constraints:
	rm -rf .venv-constraints && $(PYTHON) -m venv .venv-constraints
	.venv-constraints/bin/pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	.venv-constraints/bin/pip install -q -e '.[dev,capture,html,test-remote]' 'boto3<1.44'
	.venv-constraints/bin/pip freeze --exclude-editable | grep -iv '^torch==' > constraints.txt
	rm -rf .venv-constraints

clean:
	rm -rf $(VENV) $(DEMO_VENV) build dist *.egg-info
