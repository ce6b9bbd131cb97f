"""The rollout side of a run, built once: model path -> tokenizer -> backend -> sandbox -> engine.

Training (`trainer.build_run`), evaluation (`evaluate.run_eval`) and the study scripts all build
their components here, so a name means the same thing everywhere: `model.path=tiny` is the
pretrained tiny base whether a run trains or evaluates, and `tiny-random` the random one.

    parts = build_components(cfg.model, cfg.trainer.backend, cfg.rollout, cfg.env, cfg.sandbox)
    trajs, stats = parts.engine.run(problems)
    parts.close()

The sandbox is handed to the engine at construction: the engine starts it on its own event loop
(the sandbox's worker tasks are bound to that loop) and stops it in `engine.close()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from envs.retool import RetoolConfig, make_retool_env_factory
from sandbox import SandboxConfig, make_sandbox
from stare_tir.model import ModelConfig, load_tokenizer, resolve_model_path
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine


def make_backend(
    kind: Literal["hf", "sglang"],
    model_path: str,
    tokenizer: Any,
    rollout: RolloutConfig,
    trust_remote_code: bool = False,
) -> Any:
    """The rollout backend: hf (in-process transformers) or sglang (servers at rollout.sglang.urls)."""
    if kind == "hf":
        from stare_tir.rollout.backends.hf import HFBackend

        model: Any = model_path
        if trust_remote_code:  # HFBackend loads a path without it: hand it the built module instead
            model = _load_remote_code_model(model_path, rollout)
        return HFBackend(model, tokenizer, rollout.hf)
    if kind != "sglang":
        raise ValueError(f"backend={kind!r}: must be 'hf' or 'sglang'")
    if not rollout.sglang.urls:
        raise ValueError(
            "backend sglang needs rollout.sglang.urls (one or more SGLang server URLs, "
            "e.g. rollout.sglang.urls=[http://127.0.0.1:30000])"
        )
    from stare_tir.rollout.backends.sglang import SGLangBackend

    return SGLangBackend(rollout.sglang.urls, rollout.sglang, tokenizer=tokenizer, eos_token_ids=_eos_ids(model_path))


def _eos_ids(model_path: str) -> list[int]:
    """The model's own EOS ids (Qwen2.5: <|im_end|> and <|endoftext|>), on which SGLang stops too."""
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except (OSError, ValueError):  # no generation_config.json: the tokenizer's EOS is used
        return []
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def _load_remote_code_model(model_path: str, rollout: RolloutConfig) -> Any:
    """The policy with its repository's own code, on HFBackend's device and dtype (the same rule as
    `HFBackend.__init__`: "auto" is CUDA when available, fp32 on CPU and bf16 on GPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = rollout.hf
    device = ("cuda" if torch.cuda.is_available() else "cpu") if hf.device == "auto" else hf.device
    dtype = (torch.float32 if device == "cpu" else torch.bfloat16) if hf.dtype == "auto" else getattr(torch, hf.dtype)
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, trust_remote_code=True).to(device)


@dataclass
class Components:
    """What one rollout pipeline holds; `close()` releases it (engine + sandbox, then backend)."""

    model_path: str
    tokenizer: Any
    backend: Any
    engine: RolloutEngine

    def close(self) -> None:
        try:
            self.engine.close()
        finally:
            if self.backend is not None:
                self.backend.close()


def build_components(
    model: ModelConfig,
    backend: Literal["hf", "sglang"],
    rollout: RolloutConfig,
    env: RetoolConfig,
    sandbox: SandboxConfig,
    *,
    model_path: str | None = None,
    tokenizer: Any = None,
) -> Components:
    """Tokenizer, backend, sandbox and engine for `model` (resolved unless `model_path` is given).

    model_path: an already resolved checkpoint (the trainer's SFT output, say); tokenizer: an
    already loaded one (the learner's, so both sides share one object).
    """
    path = model_path if model_path is not None else resolve_model_path(model)
    tok = tokenizer if tokenizer is not None else load_tokenizer(model, path)
    back = make_backend(backend, path, tok, rollout, trust_remote_code=model.trust_remote_code)
    try:
        box = make_sandbox(sandbox)
        engine = RolloutEngine(back, tok, make_retool_env_factory(box, env), rollout, sandbox=box)
    except BaseException:
        back.close()
        raise
    return Components(model_path=path, tokenizer=tok, backend=back, engine=engine)
