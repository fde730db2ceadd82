# Every target creates/uses .venv and installs the package from this checkout.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?= -n 2 --dist loadgroup

.PHONY: venv demo zoo test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python
	$(BIN)/pip install -q -e ".[test]"

DEMO_DIR ?= workdirs/demo

# Trains a second-order model (mRNN) on generated Dyck-(2,4) data; leaves
# checkpoints, metrics.jsonl, TensorBoard events and figures/ldpa.png in
# $(DEMO_DIR). Rerunning resumes (and finishes at once when done).
demo: venv
	$(BIN)/python -m experiments.main --config=experiments/configs/demo.py --workdir=$(DEMO_DIR)
	@echo "demo run in $(DEMO_DIR): metrics.jsonl, checkpoints/, best/, figures/ldpa.png"

zoo: venv
	$(BIN)/python -m sorjax.demo

test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: venv
	$(BIN)/pip install -q -e ".[test,bench]"
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) build *.egg-info
