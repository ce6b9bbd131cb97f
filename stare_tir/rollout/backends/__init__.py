"""Inference backends behind one protocol (`base.Backend`): in-process Hugging Face (`hf`), SGLang
over HTTP or in process (`sglang`). Runs build them with `stare_tir.components.make_backend`; the
SGLang stand-in server for tests is tests/rollout/sglang_standin.py.

Importing this package is light: torch is imported when a backend is built.
"""

from __future__ import annotations

from stare_tir.rollout.backends.base import Backend, Generation, SamplingParams, StopChecker

__all__ = ["Backend", "Generation", "SamplingParams", "StopChecker"]
