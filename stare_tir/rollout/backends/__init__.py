"""Inference backends behind one protocol (`base.Backend`, defaults in `base.BackendBase`):
in-process Hugging Face (`hf`), SGLang over HTTP or in process (`sglang`), each registered by name
in `base.ROLLOUT_BACKENDS` where its class is defined. Runs build them with
`stare_tir.components.make_backend`; the SGLang stand-in server for tests is
tests/rollout/sglang_standin.py.

Importing this package is light: torch is imported when a backend is built.
"""

from __future__ import annotations

from stare_tir.rollout.backends.base import (
    ROLLOUT_BACKENDS,
    Backend,
    BackendBase,
    Generation,
    SamplingParams,
    StopChecker,
)

__all__ = ["ROLLOUT_BACKENDS", "Backend", "BackendBase", "Generation", "SamplingParams", "StopChecker"]
