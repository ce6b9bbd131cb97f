"""Integration: the engine with the real RetoolEnv and the real local sandbox.

The "model" is scripted (Qwen2.5 tokenizer) so the code it writes is known; the code really runs
in the local sandbox, and the observation, stats, reward and finish reason come from RetoolEnv.
"""

from __future__ import annotations

import pytest

from envs.retool import RetoolConfig, make_retool_env_factory
from sandbox import SandboxConfig, make_sandbox
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine

PROBLEM = {"id": "r0", "problem": "What is 6 * 7?", "answer": "42"}


@pytest.fixture
def run_retool(qwen_tok, scripted_backend_cls):
    """run(turns, n) -> trajectories, with one sandbox started on the engine's own loop."""
    engines = []

    def run(turns, n=1, **env_cfg):
        sandbox = make_sandbox(SandboxConfig(workers=2, preload=[]))
        backend = scripted_backend_cls(qwen_tok, turns)
        engine = RolloutEngine(
            backend,
            qwen_tok,
            make_retool_env_factory(sandbox, RetoolConfig(**env_cfg)),
            RolloutConfig(n_per_prompt=n, max_total_tokens=512, progress=False),
        )
        engines.append((engine, sandbox))
        try:
            engine.run_coroutine(sandbox.__aenter__())
        except Exception as exc:  # no namespaces/cgroups on this host
            pytest.skip(f"local sandbox unavailable here: {exc!r}")
        trajs, stats = engine.run([PROBLEM])
        return trajs, stats

    yield run
    for engine, sandbox in engines:
        try:
            engine.run_coroutine(sandbox.close())
        finally:
            engine.close()


def test_code_runs_and_answer_is_graded(run_retool, qwen_tok):
    turns = [
        "Let me compute.\n<code>\n```python\nprint(6 * 7)\nprint('<|im_end|>')\n```\n</code>",
        "The result is 42.\n<answer>\\boxed{42}</answer><EOS>",
    ]
    trajs, stats = run_retool(turns, n=2)
    for t in trajs:
        t.check()
        assert (t.finish_reason, t.reward, t.tool_calls, t.num_turns) == ("answer", 1.0, 1, 2)
        assert not t.sandbox_error and t.info["correct"] is True
        (s0, e0), (s1, _) = t.model_spans()
        obs = qwen_tok.decode(t.response_ids[e0:s1])
        assert obs.startswith("\n<interpreter>\n42\n") and obs.endswith("</interpreter>\n")
        assert all(i < 151643 for i in t.response_ids[e0:s1])  # printed control strings stay text
        assert t.loss_mask[e0:s1] == [0] * (s1 - e0)
    assert stats["engine/tool_calls"] == 2 and stats["finish/answer"] == 1.0


def test_timeout_and_wrong_answer(run_retool):
    turns = ["<code>\n```python\nwhile True:\n    pass\n```\n</code>", "I could not finish; guessing \\boxed{41}.<EOS>"]
    (t,), _ = run_retool(turns, code_timeout_s=1.0)
    assert t.timeouts == 1 and t.tool_calls == 1 and not t.sandbox_error
    assert "TimeoutError" in t.text
    assert t.finish_reason == "answer" and t.reward == -1.0 and t.info["pred"] == "41"
