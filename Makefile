# Set-up and checks from a fresh clone with only Python 3.11 and pip.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install demo test bench clean

$(BIN)/attntrace: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch pinned to the CPU build: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,capture,html,test-remote]'
	# Bytecode for the editable package: where PYTHONDONTWRITEBYTECODE is set, every run would compile it again.
	$(BIN)/python -m compileall -q attntrace
	touch $@

install: $(BIN)/attntrace

demo: install
	$(BIN)/attntrace summary sample_traces/bf16_causal_fwd/naive.pt.trace.json.gz
	$(BIN)/attntrace lint sample_traces/ --fail-on never

test: install
	$(BIN)/ruff check .
	$(BIN)/pytest -q

bench: install
	$(BIN)/python bench/bench_read.py

clean:
	rm -rf $(VENV) build dist *.egg-info
