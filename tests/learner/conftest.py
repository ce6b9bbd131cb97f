"""Shared fixtures for the learner tests (CPU, gloo, the tiny Qwen2 checkpoint)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _load_worker():
    spec = importlib.util.spec_from_file_location("learner_worker", HERE / "learner_worker.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def worker():
    """tests/learner/learner_worker.py as a module: fixed data and the 2-step update."""
    return _load_worker()


@pytest.fixture(scope="session")
def tiny_path() -> str:
    from stare_tir.model import ensure_tiny_checkpoint

    return str(ensure_tiny_checkpoint())


@pytest.fixture(scope="session")
def vocab(tiny_path) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(tiny_path).vocab_size
