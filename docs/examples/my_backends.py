"""A rollout backend and a sandbox backend of one's own.

    stare-train --plugin docs/examples/my_backends.py trainer.backend=canned rollout.canned.text="..."
    stare-train --plugin docs/examples/my_backends.py sandbox.backend=disabled

A rollout backend is a class registered in ROLLOUT_BACKENDS with its settings dataclass
(`config=`: its section is `rollout.<name>`); it subclasses `BackendBase` (the defaults of every
capability of shared servers), writes `from_config`, `generate`, `update_weights` and
`update_weights_from_disk`, and may refuse settings in `check_config`. A sandbox backend is a
class registered in SANDBOX_BACKENDS (settings: `sandbox.<name>`); it subclasses `SandboxBase`,
is built from the `SandboxConfig` and writes `start`, `session` and `close`; every failure of a
cell comes back as an `ExecResult`, never an exception.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from sandbox import SANDBOX_BACKENDS, ExecResult, ExecStatus, SandboxBase
from stare_tir.rollout.backends.base import ROLLOUT_BACKENDS, BackendBase, Generation, SamplingParams


@dataclass
class CannedConfig:
    # What every generate() call answers (tokenized with the run's tokenizer), cut to the call's
    # token budget: a backend for wiring tests and dry runs, no model involved.
    text: str = "The answer is \\boxed{0}."


@ROLLOUT_BACKENDS.register("canned", config=CannedConfig)
class CannedBackend(BackendBase):
    """Answers every request with the same text; log-probabilities 0 (as if greedy and certain)."""

    def __init__(self, tokenizer: Any, cfg: CannedConfig) -> None:
        self.ids = list(tokenizer(cfg.text, add_special_tokens=False)["input_ids"])
        self.pushes = 0

    @classmethod
    def from_config(cls, model_path: str, tokenizer: Any, rollout: Any, trust_remote_code: bool = False):
        return cls(tokenizer, rollout.canned)  # rollout.canned: this backend's settings section

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, stop: list[str]) -> Generation:
        ids = self.ids[: sampling.max_new_tokens]
        reason = "eos" if len(ids) == len(self.ids) else "length"
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=reason)

    def update_weights(self, named_tensors, version: str | None = None) -> None:
        for _ in named_tensors:  # consume them, as a real backend would load them
            pass
        self.pushes += 1

    def update_weights_from_disk(self, path: str) -> None:
        self.pushes += 1


@dataclass
class DisabledSandboxConfig:
    # What the model reads instead of its code's output (a no-tool ablation keeps the format).
    message: str = "code execution is disabled in this run"


@SANDBOX_BACKENDS.register("disabled", config=DisabledSandboxConfig)
class DisabledSandbox(SandboxBase):
    """Runs nothing: every cell answers `sandbox.disabled.message` as a failed cell."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.message = cfg.disabled.message  # cfg: the SandboxConfig; its section sandbox.disabled

    async def start(self) -> None:
        self.info = {"backend": "disabled", "not_enforced": []}  # nothing runs, nothing to enforce

    @contextlib.asynccontextmanager
    async def session(self, stateless: bool = False):
        yield _Session(self.message)

    async def close(self) -> None:
        pass


class _Session:
    def __init__(self, message: str) -> None:
        self.message = message

    async def run(self, code: str, timeout: float | None = None) -> ExecResult:
        return ExecResult(ExecStatus.ERROR, 1, None, "", f"RuntimeError: {self.message}", False, False, 0.0)

    async def close(self) -> None:
        pass
