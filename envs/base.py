"""The environment protocol between the rollout engine and a task.

One `Env` instance serves exactly one trajectory: it builds the prompt messages, reacts to each
model turn (for Retool: runs the turn's code in its own sandbox session and returns the
interpreter observation), grades the finished response and is closed at the end. The engine only
sees this protocol, so tasks can be swapped without touching the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable


@dataclass
class StepResult:
    """What the env answers to one model turn.

    observation: text appended after the model's turn verbatim (the engine tokenizes it once and
        masks it out of the loss), or None when nothing is appended. An env with `tools` (a chat
        tool format, envs/tool_formats/) returns the content of a `tool` message instead, which the
        engine renders with the model's chat template.
    done: True when the trajectory is finished (final answer, no code, budget spent, infra error).
    info: per-turn details for logging (status of the code run, whether it timed out, ...).
    """

    observation: str | None
    done: bool
    info: dict = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """One trajectory's task environment (see module docstring)."""

    stop_strings: list[str]  # generation stops at any of these (e.g. ["</code>"])
    stats: dict  # tool_calls, code_errors, timeouts, sandbox_errors, void_turns
    sandbox_error: bool  # True once the infrastructure failed on this trajectory

    def initial_messages(self) -> list[dict]:
        """Chat messages [{"role": "system"|"user", "content": str}, ...] for the prompt."""
        ...

    async def step(self, turn_text: str) -> StepResult:
        """React to the decoded text of this model turn only."""
        ...

    def reward(self, response_text: str) -> tuple[float, dict]:
        """Grade the full response; info holds at least "correct": bool and "pred": str | None."""
        ...

    async def close(self) -> None:
        """Release the trajectory's resources (its sandbox session)."""
        ...


# The engine builds one env per trajectory from a problem dict {"id", "problem", "answer", ...}.
EnvFactory = Callable[[dict], Env]
