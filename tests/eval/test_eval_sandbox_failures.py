"""Samples that fail on the sandbox (not the model's fault): each row records the cause, and the
evaluation says that a rerun retries them. Through the real engine and RetoolEnv, with a sandbox
whose every other session fails as a lost worker does."""

from __future__ import annotations

import contextlib
from pathlib import Path

from envs.retool import RetoolConfig, make_retool_env_factory
from stare_tir.eval.evaluate import EvalConfig, evaluate, read_rows
from stare_tir.rollout.backends.base import BackendBase, Generation, SamplingParams
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine


class Ok:
    status = "ok"
    stdout = "4\n"
    stderr = ""
    duration_s = 0.01


class FlakySandbox:
    """Odd-numbered sessions raise when their cell runs (a worker that died)."""

    def __init__(self) -> None:
        self.sessions = 0

    @contextlib.asynccontextmanager
    async def session(self, stateless: bool = False):
        self.sessions += 1
        broken = self.sessions % 2 == 1

        class Session:
            async def run(self, code: str, timeout: float | None = None):
                if broken:
                    raise ConnectionResetError("sandbox worker 3 went away")
                return Ok()

        yield Session()


class TwoTurns(BackendBase):
    """A code cell, then (after an interpreter answer) the boxed answer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, stop: list[str]) -> Generation:
        seen = self.tokenizer.decode(prompt_ids)
        if "<interpreter>" not in seen.rpartition("<|im_start|>assistant\n")[2]:
            ids = self.tokenizer.encode("<code>\n```python\nprint(2 + 2)\n```\n</code>", add_special_tokens=False)
            return Generation(ids, [-0.1] * len(ids), "stop", "</code>")
        ids = self.tokenizer.encode("<answer>\\boxed{4}</answer>", add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        return Generation(ids, [-0.1] * len(ids), "eos")


def test_sandbox_failures_record_their_cause_and_a_rerun_is_announced(tmp_path: Path) -> None:
    from loguru import logger

    from stare_tir.model import build_qwen_tokenizer

    tok = build_qwen_tokenizer()
    problems = [{"id": f"p{i}", "problem": f"What is 2+2? ({i})", "answer": "4"} for i in range(4)]
    rollout = RolloutConfig(max_turns=4, max_total_tokens=1024, max_new_tokens_per_turn=256, progress=False)
    engine = RolloutEngine(TwoTurns(tok), tok, make_retool_env_factory(FlakySandbox(), RetoolConfig()), rollout)
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING", format="{message}")
    try:
        cfg = EvalConfig(datasets=["toy"], n=1, pass_ks=[1], chunk_size=4)
        evaluate(engine, cfg, tmp_path, datasets={"toy": problems})
    finally:
        logger.remove(sink)
        engine.close()
    rows = read_rows(tmp_path / "toy.jsonl")
    failed = [r for r in rows if r["sandbox_error"]]
    assert len(failed) == 2 and len(rows) == 4
    assert all(r["error"] == "ConnectionResetError: sandbox worker 3 went away" for r in failed), failed
    log = "".join(lines)
    assert "toy: 2 samples failed on the sandbox or backend (first: ConnectionResetError" in log, log
    assert "rerunning the same command retries them" in log
