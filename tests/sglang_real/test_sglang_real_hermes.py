"""Native tool calling (env.tool_format=hermes) against the REAL SGLang server: the same tokens
whatever the backend.

The tiny base model has never written a `<tool_call>`, so the first turn of each trajectory is a
scripted call (given as ids, as if sampled); every later turn is generated greedily by the backend
under test, conditioned on the prompt, that call and the tool turn its chat template renders. The
real server and the in-process HF backend must then produce the same trajectory, id for id, and at
every turn boundary each backend must have been conditioned on exactly the ids it is trained on.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from envs.retool import RetoolConfig, RetoolEnv
from sandbox.base import ExecResult, ExecStatus
from stare_tir.model import TINY_TEMPLATES
from stare_tir.rollout.backends.base import Generation
from stare_tir.rollout.backends.sglang import SGLangBackend
from stare_tir.rollout.chat_turns import encode_template_text
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine

from .conftest import TINY_BASE

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sglang_real")]

CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call>'
PROBLEMS = [
    {"id": f"p{i}", "problem": f"What is {a}*{b}?", "answer": str(a * b)} for i, (a, b) in enumerate([(6, 7), (12, 34)])
]


class EvalSandbox:
    def session(self, stateless=False):
        class Session:
            async def run(self, code, timeout=None):
                out = str(eval(code.removeprefix("print(").removesuffix(")"), {"__builtins__": {}}))
                return ExecResult(ExecStatus("ok"), 0, None, out + "\n", "", False, False, 0.01, "")

            async def __aenter__(self):
                return self

            async def __aexit__(self, *exc):
                return None

        return Session()


class ScriptedFirstTurn:
    """The first turn of a trajectory is `first` (a tool call); later turns come from `inner`."""

    def __init__(self, inner, first: list[int]) -> None:
        self.inner, self.first, self.calls = inner, first, []

    async def generate(self, prompt_ids, sampling, stop):
        prompt_ids = list(prompt_ids)
        first = not any(len(c) < len(prompt_ids) and prompt_ids[: len(c)] == c for c in self.calls)
        self.calls.append(prompt_ids)
        if first:
            return Generation(list(self.first), [-0.5] * len(self.first), "stop", "</tool_call>")
        return await self.inner.generate(prompt_ids, sampling, stop)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def close(self) -> None:
        self.inner.close()


def rollout(inner, tok):
    backend = ScriptedFirstTurn(inner, encode_template_text(tok, CALL))
    env_cfg = RetoolConfig(tool_format="hermes", prompt="short")
    cfg = RolloutConfig(
        n_per_prompt=1, max_turns=2, max_total_tokens=200, max_new_tokens_per_turn=24, temperature=0.0, progress=False
    )
    engine = RolloutEngine(backend, tok, lambda p: RetoolEnv(p, EvalSandbox(), env_cfg), cfg)
    try:
        trajs, stats = engine.run(PROBLEMS)
    finally:
        engine.close()
    return trajs, stats, backend.calls


def test_hermes_rollouts_are_the_same_tokens_on_the_real_server_and_in_process(sglang_server):
    from stare_tir.rollout.backends.hf import HFBackend

    tok = AutoTokenizer.from_pretrained(str(TINY_BASE))
    tok.chat_template = (TINY_TEMPLATES / "tiny_tools.jinja").read_text()
    hf = HFBackend(str(TINY_BASE))
    try:
        local, _, _ = rollout(hf, tok)
    finally:
        hf.close()
    server, stats, calls = rollout(SGLangBackend([sglang_server.url], tokenizer=tok), tok)
    assert stats["rollout/tool_calls"] == 1.0
    for a, b in zip(server, local):
        a.check()
        assert a.tool_calls == 1 and len(a.model_spans()) == 2
        assert (a.prompt_ids, a.response_ids, a.loss_mask) == (b.prompt_ids, b.response_ids, b.loss_mask)
        # the second turn was conditioned on exactly the ids trained on: prompt + call + tool turn
        (_, call_end), (start, _) = a.model_spans()
        assert a.prompt_ids + a.response_ids[:start] in calls
        assert tok.decode(a.response_ids[call_end:start]) == (
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        )
