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
from typing import Any

from envs.retool import RetoolConfig, make_retool_env_factory
from envs.tool_formats import make_tool_format
from sandbox import SandboxConfig, make_sandbox
from stare_tir.model import ModelConfig, chat_template_name, load_tokenizer, resolve_model_path
from stare_tir.rollout.backends.base import ROLLOUT_BACKENDS, Backend
from stare_tir.rollout.chat_turns import check_tool_template
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine


def make_backend(
    kind: str, model_path: str, tokenizer: Any, rollout: RolloutConfig, trust_remote_code: bool = False
) -> Backend:
    """The rollout backend registered as `kind` (`ROLLOUT_BACKENDS`: hf in-process transformers,
    sglang the servers at rollout.sglang.urls), built from the run's settings."""
    return ROLLOUT_BACKENDS.get(kind).from_config(model_path, tokenizer, rollout, trust_remote_code)


@dataclass
class Components:
    """What one rollout pipeline holds; `close()` releases it (engine + sandbox, then backend)."""

    model_path: str
    tokenizer: Any
    backend: Backend
    engine: RolloutEngine

    def close(self) -> None:
        try:
            self.engine.close()
        finally:
            self.backend.close()


def build_components(
    model: ModelConfig,
    backend: str,
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
    # A chat tool format needs a template that shows tools and keeps earlier turns as they were.
    check_tool_template(tok, make_tool_format(env.tool_format), chat_template_name(model, path))
    back = make_backend(backend, path, tok, rollout, trust_remote_code=model.trust_remote_code)
    try:
        box = make_sandbox(sandbox)
        engine = RolloutEngine(back, tok, make_retool_env_factory(box, env), rollout, sandbox=box)
    except BaseException:
        back.close()
        raise
    return Components(model_path=path, tokenizer=tok, backend=back, engine=engine)
