"""Shared fakes for the rollout tests: a scripted env, a scripted backend, tiny-model fixtures.

FakeEnv "runs" code by evaluating simple arithmetic and sleeps to stand in for sandbox latency.
ScriptedBackend writes predetermined turns token by token (any tokenization we choose, even a
non-canonical one) and applies the real StopChecker, so engine tests control exactly what the
"model" says while recording exactly what it was conditioned on.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

import pytest

from envs.base import StepResult
from stare_tir.rollout.backends.base import BackendBase, Generation, SamplingParams, StopChecker, fast_decoder

CODE_RE = re.compile(r"<code>\s*```python\s*(.*?)```\s*</code>", re.DOTALL)


class FakeEnv:
    """Retool-like env: evaluates `print(<arithmetic>)` and sleeps `latency` per tool call."""

    def __init__(
        self,
        problem: dict,
        latency: float = 0.0,
        fail_on_step: bool = False,
        sandbox_error_on_call: int | None = None,
        obs_suffix: str = "",
    ) -> None:
        self.problem = problem
        self.stop_strings = ["</code>"]
        self.stats = {"tool_calls": 0, "code_errors": 0, "timeouts": 0, "sandbox_errors": 0, "void_turns": 0}
        self.sandbox_error = False
        self.latency = latency
        self.fail_on_step = fail_on_step
        self.sandbox_error_on_call = sandbox_error_on_call
        self.obs_suffix = obs_suffix
        self.turn_texts: list[str] = []
        self.closed = False

    def initial_messages(self) -> list[dict]:
        return [
            {"role": "system", "content": "Use <code> for Python."},
            {"role": "user", "content": self.problem["problem"]},
        ]

    async def step(self, turn_text: str) -> StepResult:
        self.turn_texts.append(turn_text)
        if self.fail_on_step:
            raise RuntimeError("env exploded")
        m = CODE_RE.search(turn_text)
        if m is None:
            if "\\boxed" in turn_text:
                return StepResult(None, True, {"reason": "answer"})
            self.stats["void_turns"] += 1
            return StepResult(None, True, {"reason": "no_code"})
        self.stats["tool_calls"] += 1
        await asyncio.sleep(self.latency)
        if self.sandbox_error_on_call == self.stats["tool_calls"]:
            self.sandbox_error = True
            self.stats["sandbox_errors"] += 1
            return StepResult("\n<interpreter>\nSandboxError\n</interpreter>\n", True, {"reason": "sandbox_error"})
        expr = m.group(1).strip()
        inner = re.fullmatch(r"print\((.*)\)", expr)
        try:
            out = str(eval(inner.group(1), {"__builtins__": {}})) if inner else ""
        except Exception as exc:  # noqa: BLE001 - shown to the model like a traceback
            out = f"{type(exc).__name__}"
        return StepResult(f"\n<interpreter>\n{out}{self.obs_suffix}\n</interpreter>\n", False, {"status": "ok"})

    def reward(self, response_text: str) -> tuple[float, dict]:
        m = re.findall(r"\\boxed\{([^}]*)\}", response_text)
        pred = m[-1] if m else None
        correct = pred is not None and pred.strip() == str(self.problem["answer"])
        return (1.0 if correct else -1.0), {"correct": correct, "pred": pred}

    async def close(self) -> None:
        self.closed = True


@dataclass
class Call:
    prompt_ids: list[int]
    sampling: SamplingParams
    stop: list[str]


@dataclass
class ScriptedBackend(BackendBase):
    """Writes `turns[k]` on the k-th call for a trajectory (identified by its prompt).

    turns: a list of turns; each is a string (tokenized with `tokenizer`) or an explicit id list.
    eos: appended after a turn ending with "<EOS>" (the marker itself is not text).
    """

    tokenizer: object
    turns: list
    latency: float = 0.0
    eos_id: int | None = None
    calls: list = field(default_factory=list)
    _progress: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._decode = fast_decoder(self.tokenizer)
        if self.eos_id is None:
            self.eos_id = self.tokenizer.eos_token_id

    def _turn_ids(self, turn) -> list[int]:
        if isinstance(turn, list):
            return list(turn)
        eos = turn.endswith("<EOS>")
        text = turn[: -len("<EOS>")] if eos else turn
        ids = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return list(ids) + ([self.eos_id] if eos else [])

    async def generate(self, prompt_ids, sampling, stop) -> Generation:
        self.calls.append(Call(list(prompt_ids), sampling, list(stop)))
        await asyncio.sleep(self.latency)
        # Which turn of its trajectory this is: the longest earlier (prompt + output) that
        # prefixes this prompt was turn k-1 (samples of one problem share keys harmlessly).
        idx, best = 0, -1
        for key, nxt in self._progress.items():
            if len(key) > best and len(key) <= len(prompt_ids) and tuple(prompt_ids[: len(key)]) == key:
                idx, best = nxt, len(key)
        ids = self._turn_ids(self.turns[min(idx, len(self.turns) - 1)])
        gen = self._emit(ids, sampling, stop)
        self._progress[tuple(prompt_ids) + tuple(gen.token_ids)] = idx + 1
        return gen

    def _emit(self, ids, sampling, stop) -> Generation:
        checker = StopChecker(self._decode, stop)
        out: list[int] = []
        for t in ids:
            if len(out) >= sampling.max_new_tokens:
                break
            out.append(t)
            if t == self.eos_id:
                return Generation(out, [-0.5] * len(out), "eos")
            hit = checker.feed(out)
            if hit is not None:
                return Generation(out, [-0.5] * len(out), "stop", hit)
        return Generation(out, [-0.5] * len(out), "length")

    def update_weights(self, named_tensors) -> None:
        pass

    def update_weights_from_disk(self, path: str) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tests run two per 2-core machine (xdist): two intra-op threads each would oversubscribe the
    cores, and OpenMP spin-waiting then slows the tiny model 10x or more."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def qwen_tok():
    from stare_tir.model import build_qwen_tokenizer

    return build_qwen_tokenizer()


@pytest.fixture(scope="session")
def tiny_path():
    from stare_tir.model import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint()


@pytest.fixture(scope="session")
def tiny_tok(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_path))


@pytest.fixture
def fake_env_cls():
    return FakeEnv


@pytest.fixture
def scripted_backend_cls():
    return ScriptedBackend
