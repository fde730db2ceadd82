# Every target creates/uses .venv and installs the package from this checkout.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?= -n 2

.PHONY: venv demo test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python
	$(BIN)/pip install -q -e ".[test]"

demo: venv
	$(BIN)/python -m sorjax.demo

test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: venv
	$(BIN)/pip install -q -e ".[test,bench]"
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) build *.egg-info
