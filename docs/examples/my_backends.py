"""A rollout backend and a sandbox backend of one's own.

    stare-train --plugin docs/examples/my_backends.py trainer.backend=canned rollout.canned.text="..."
    stare-train --plugin docs/examples/my_backends.py sandbox.backend=subprocess env.stateful=false

A rollout backend is a class registered in ROLLOUT_BACKENDS with its settings dataclass
(`config=`: its section is `rollout.<name>`); it subclasses `BackendBase` (the defaults of every
capability of shared servers), writes `from_config`, `generate`, `update_weights` and
`update_weights_from_disk`, and may refuse settings in `check_config`. A sandbox backend is a
class registered in SANDBOX_BACKENDS (settings: `sandbox.<name>`); it subclasses `SandboxBase`,
is built from the `SandboxConfig` and writes `start`, `session` and `close`; every failure of a
cell comes back as an `ExecResult`, never an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
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
class SubprocessConfig:
    # The interpreter that runs each cell ("": this process's own, with its packages).
    python: str = ""


@SANDBOX_BACKENDS.register("subprocess", config=SubprocessConfig)
class SubprocessSandbox(SandboxBase):
    """Each cell in a fresh `python -c` child process, under sandbox.limits.wall_time_s and
    max_output_bytes. NO isolation: trusted code only (the model's code runs as you, with your
    files and network), and no state between cells (run it with env.stateful=false). `info`
    says so, as every backend must say what it does not enforce."""

    def __init__(self, cfg: Any) -> None:  # cfg: the SandboxConfig; this backend's section: cfg.subprocess
        super().__init__()
        self.python = cfg.subprocess.python or sys.executable
        self.limits = cfg.limits

    async def start(self) -> None:
        not_enforced = ["isolation", "network", "memory_mb", "disk_mb", "max_processes", "cpus", "stateful sessions"]
        self.info = {"backend": "subprocess", "not_enforced": not_enforced}

    @contextlib.asynccontextmanager
    async def session(self, stateless: bool = False):
        yield _Session(self.python, self.limits)

    async def close(self) -> None:
        pass


class _Session:
    def __init__(self, python: str, limits: Any) -> None:
        self.python, self.limits = python, limits

    async def run(self, code: str, timeout: float | None = None) -> ExecResult:
        start = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except OSError as e:  # the infrastructure failed: a result, never an exception
            return ExecResult.infra_failure(f"cannot start {self.python}: {e}")
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.limits.wall_time(timeout))
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return ExecResult(ExecStatus.TIMEOUT, 137, 9, "", "", False, False, time.monotonic() - start, "wall time")
        cap, rc = self.limits.max_output_bytes, proc.returncode
        signal = -rc if rc < 0 else None
        status = ExecStatus.OK if rc == 0 else ExecStatus.KILLED if signal else ExecStatus.ERROR
        return ExecResult(
            status,
            128 + signal if signal else rc,
            signal,
            out[:cap].decode(errors="replace"),
            err[:cap].decode(errors="replace"),
            len(out) > cap,
            len(err) > cap,
            time.monotonic() - start,
        )

    async def close(self) -> None:
        pass
