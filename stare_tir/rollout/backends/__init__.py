"""Inference backends behind one protocol (`base.Backend`): in-process Hugging Face (`hf`), SGLang
over HTTP or in process (`sglang`). The SGLang stand-in server for tests is tests/rollout/sglang_standin.py.

Importing this package is light: torch is imported when a backend is built.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from stare_tir.rollout.backends.base import Backend, Generation, SamplingParams, StopChecker

__all__ = ["Backend", "Generation", "SamplingParams", "StopChecker", "make_backend"]


def make_backend(kind: Literal["hf", "sglang"], *, model: Any = None, tokenizer: Any = None,
                 cfg: Any = None, urls: list[str] | None = None) -> Backend:
    """Build a backend from a `RolloutConfig` (`cfg.hf` / `cfg.sglang` are used).

    hf: `model` is a loaded HF model or a checkpoint path (tokenizer loaded from it if omitted).
    sglang: `urls` (or cfg.sglang.urls) name the servers; the model is whatever they serve.
    """
    if kind == "hf":
        from stare_tir.rollout.backends.hf import HFBackend

        return HFBackend(model, tokenizer, cfg.hf if cfg is not None else None)
    if kind == "sglang":
        from stare_tir.rollout.backends.sglang import SGLangBackend

        return SGLangBackend(urls, cfg.sglang if cfg is not None else None, tokenizer=tokenizer)
    raise ValueError(f"kind={kind!r}: must be 'hf' or 'sglang'")
