"""Helpers shared across test folders."""

from __future__ import annotations

import importlib.util
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
