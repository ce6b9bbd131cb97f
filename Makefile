# Set-up and entry points. `make train` and `make test` create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup train test bench clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch first (pinned): an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

setup: $(BIN)/.installed

train: setup
	$(BIN)/python scripts/train_tir.py

# One torch thread per test worker: two workers on two cores must not oversubscribe them.
test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadgroup tests

clean:
	rm -rf $(VENV) runs
