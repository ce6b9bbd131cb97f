"""End to end through the real rollout engine, RetoolEnv, local sandbox and grader.

A scripted policy (a `Backend` that emits fixed text through the real tokenizer, token ids in and
out like any backend) writes correct Python for four AIME 2024 problems, reads the interpreter's
output from its context on the next turn and boxes it. Accuracy must be 100%; a policy that boxes
the printed value plus one must get 0%; a rerun must only generate the missing samples.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from envs.data import load_problems
from envs.retool import RetoolConfig, make_retool_env_factory
from sandbox import SandboxConfig, make_sandbox
from stare_tir.eval.evaluate import EvalConfig, evaluate, read_rows
from stare_tir.rollout.backends.base import BackendBase, Generation, SamplingParams
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine

# Brute-force solutions of four AIME 2024 problems, keyed by a phrase of the problem text.
SOLUTIONS = {
    "A stack of $n$ tokens": (  # aime2024-I-3, answer 809
        "win = [False] * 2025\n"
        "for n in range(1, 2025):\n"
        "    win[n] = any(n >= m and not win[n - m] for m in (1, 4))\n"
        "print(sum(1 for n in range(1, 2025) if not win[n]))"
    ),
    "Jen enters a lottery": (  # aime2024-I-4, answer 116
        "from fractions import Fraction\n"
        "from itertools import combinations\n"
        "mine = {1, 2, 3, 4}\n"
        "draws = [set(d) for d in combinations(range(1, 11), 4)]\n"
        "prize = [d for d in draws if len(d & mine) >= 2]\n"
        "p = Fraction(sum(d == mine for d in prize), len(prize))\n"
        "print(p.numerator + p.denominator)"
    ),
    "n^{4}+1": (  # aime2024-I-13, answer 110
        "primes = [q for q in range(2, 200) if all(q % d for d in range(2, q))]\n"
        "def least_n(p):\n"
        "    return next((n for n in range(1, p * p + 1) if (n**4 + 1) % (p * p) == 0), None)\n"
        "p = next(q for q in primes if least_n(q))\n"
        "print(least_n(p))"
    ),
    "changed to $1$": (  # aime2024-II-7, answer 699
        "def ok(N):\n"
        "    s = str(N)\n"
        "    return all(int(s[:i] + '1' + s[i + 1:]) % 7 == 0 for i in range(4))\n"
        "N = max(n for n in range(1000, 10000) if ok(n))\n"
        "q, r = divmod(N, 1000)\n"
        "print(q + r)"
    ),
}
PROBLEM_IDS = ["aime2024-I-3", "aime2024-I-4", "aime2024-I-13", "aime2024-II-7"]


class ScriptedBackend(BackendBase):
    """Turn 1: a code block solving the problem. Turn 2: box the interpreter's output (+ offset).

    Implements the Backend protocol: prompt ids in, sampled ids out. The text is encoded with the
    real tokenizer and the ids are returned whole, including the token that completes `</code>`
    and the EOS id, exactly as a sampling backend would.
    """

    def __init__(self, tokenizer, offset: int = 0, detour: bool = False) -> None:
        self.tokenizer = tokenizer
        self.offset = offset
        # detour: first a crashing cell, then one that times out, then the solution.
        self.detour = detour
        self.first_turns = 0  # trajectories started: one per sample generated
        self.calls = 0

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, stop: list[str]) -> Generation:
        self.calls += 1
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        question, _, response = prompt.rpartition("<|im_start|>assistant\n")
        key = next(k for k in SOLUTIONS if k in question)
        outputs = re.findall(r"<interpreter>\n(.*?)\n</interpreter>", response, re.DOTALL)
        if not outputs:
            self.first_turns += 1
        cells = (["print(1 / 0)", "import time\ntime.sleep(30)"] if self.detour else []) + [SOLUTIONS[key]]
        if len(outputs) < len(cells):
            assert "</code>" in stop
            ids = self._ids("Let me use Python.\n<code>\n```python\n" + cells[len(outputs)] + "\n```\n</code>")
            return Generation(ids, [-0.1] * len(ids), "stop", "</code>")
        printed = outputs[-1].strip()
        value = int(printed) + self.offset
        ids = self._ids(f"The program prints {printed}.\n<answer>\n\\boxed{{{value}}}\n</answer>")
        ids.append(self.tokenizer.eos_token_id)
        return Generation(ids, [-0.1] * len(ids), "eos")

    def update_weights(self, named_tensors) -> None:
        raise RuntimeError("a scripted policy has no weights to update")

    def update_weights_from_disk(self, path: str) -> None:
        raise RuntimeError("a scripted policy has no weights to update")

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def tokenizer():
    from stare_tir.model import build_qwen_tokenizer

    return build_qwen_tokenizer()  # the real Qwen2.5 BPE: real token boundaries


@pytest.fixture(scope="module")
def problems() -> list[dict]:
    by_id = {p["id"]: p for p in load_problems("aime24")}
    return [by_id[i] for i in PROBLEM_IDS]


def run_eval(tokenizer, backend, problems, out_dir, n: int, datasets=("aime24",)) -> dict:
    """The evaluation as the script runs it: real engine, RetoolEnv, local sandbox, grader."""
    sandbox = make_sandbox(SandboxConfig(workers=2))
    env_cfg = RetoolConfig(code_timeout_s=1.0)
    rollout = RolloutConfig(max_turns=6, max_total_tokens=4096, max_new_tokens_per_turn=1024, progress=False)
    engine = RolloutEngine(backend, tokenizer, make_retool_env_factory(sandbox, env_cfg), rollout)
    engine.run_coroutine(sandbox.__aenter__())
    try:
        cfg = EvalConfig(datasets=list(datasets), n=n, pass_ks=[1, 2, 4], chunk_size=3)
        return evaluate(engine, cfg, out_dir, datasets={name: problems for name in datasets})
    finally:
        engine.run_coroutine(sandbox.__aexit__(None, None, None))
        engine.close()


def test_scripted_correct_policy_scores_100(tokenizer, problems, tmp_path: Path) -> None:
    backend = ScriptedBackend(tokenizer)
    summary = run_eval(tokenizer, backend, problems, tmp_path, n=2)
    m = summary["datasets"]["aime24"]
    assert backend.first_turns == 8
    assert m["problems"] == 4 and m["samples"] == 8 and m["sandbox_error_samples"] == 0
    assert m["avg@2"] == 1.0 and m["pass@1"] == 1.0 and m["pass@2"] == 1.0 and m["maj@2"] == 1.0
    assert "pass@4" not in m
    assert m["mean_tool_calls"] == 1.0 and m["code_error_rate"] == 0.0 and m["timeout_rate"] == 0.0
    assert m["finish_reasons"] == {"answer": 1.0} and m["answer_rate"] == 1.0
    rows = read_rows(tmp_path / "aime24.jsonl")
    assert sorted((r["problem_id"], r["sample_idx"]) for r in rows) == sorted(
        (pid, i) for pid in PROBLEM_IDS for i in range(2)
    )
    gold = {p["id"]: p["answer"] for p in problems}
    for r in rows:
        assert r["correct"] and r["pred"] == gold[r["problem_id"]] == r["gold"]
        # The full text holds the code, the real interpreter output and the answer.
        assert (
            "<code>" in r["text"]
            and f"<interpreter>\n{gold[r['problem_id']]}\n</interpreter>" in r["text"]
            and "\\boxed{" in r["text"]
        )
        assert r["generated_tokens"] < r["response_tokens"] and r["num_turns"] == 2
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["datasets"]["aime24"]["avg@2"] == 1.0


def test_scripted_wrong_policy_scores_0(tokenizer, problems, tmp_path: Path) -> None:
    summary = run_eval(tokenizer, ScriptedBackend(tokenizer, offset=1), problems, tmp_path, n=2)
    m = summary["datasets"]["aime24"]
    assert m["samples"] == 8
    assert m["avg@2"] == 0.0 and m["pass@2"] == 0.0 and m["maj@2"] == 0.0
    assert m["answer_rate"] == 1.0  # answered, and wrong
    gold = {p["id"]: p["answer"] for p in problems}
    for r in read_rows(tmp_path / "aime24.jsonl"):
        assert not r["correct"] and r["pred"] == str(int(gold[r["problem_id"]]) + 1)


def test_code_errors_and_timeouts_are_counted(tokenizer, problems, tmp_path: Path) -> None:
    summary = run_eval(tokenizer, ScriptedBackend(tokenizer, detour=True), problems, tmp_path, n=1)
    m = summary["datasets"]["aime24"]
    assert m["avg@1"] == 1.0  # the third cell still solves it
    assert m["mean_tool_calls"] == 3.0
    assert m["code_error_rate"] == pytest.approx(1 / 3)
    assert m["timeout_rate"] == pytest.approx(1 / 3)
    row = read_rows(tmp_path / "aime24.jsonl")[0]
    assert "ZeroDivisionError" in row["text"] and "TimeoutError" in row["text"]
    assert row["code_errors"] == 1 and row["timeouts"] == 1 and row["tool_calls"] == 3


def test_resume_skips_finished_samples(tokenizer, problems, tmp_path: Path) -> None:
    first = ScriptedBackend(tokenizer)
    run_eval(tokenizer, first, problems, tmp_path, n=2)
    assert first.first_turns == 8
    path = tmp_path / "aime24.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == 8
    # Simulate a crash: 5 rows survive, one of them an infrastructure failure, plus a torn line.
    kept = [json.loads(line) for line in lines[:5]]
    kept[0]["sandbox_error"] = True
    path.write_text("".join(json.dumps(r) + "\n" for r in kept) + lines[5][: len(lines[5]) // 2])

    second = ScriptedBackend(tokenizer)
    summary = run_eval(tokenizer, second, problems, tmp_path, n=2)
    m = summary["datasets"]["aime24"]
    assert second.first_turns == 4  # 3 missing + 1 sandbox failure retried
    assert m["resumed_samples"] == 4 and m["new_samples"] == 4
    assert m["samples"] == 8 and m["avg@2"] == 1.0 and m["sandbox_error_samples"] == 0
    rows = read_rows(path)  # every line parses again: the torn tail was dropped
    assert len(rows) == 9 and len(path.read_text().splitlines()) == 9

    third = ScriptedBackend(tokenizer)
    summary = run_eval(tokenizer, third, problems, tmp_path, n=2)
    assert third.first_turns == 0 and third.calls == 0
    assert summary["datasets"]["aime24"]["resumed_samples"] == 8

    fourth = ScriptedBackend(tokenizer)  # asking for more samples generates only the new ones
    summary = run_eval(tokenizer, fourth, problems, tmp_path, n=3)
    assert fourth.first_turns == 4
    assert summary["datasets"]["aime24"]["samples"] == 12


def test_six_benchmark_average_when_all_six_ran(tokenizer, problems, tmp_path: Path) -> None:
    six = ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"]
    summary = run_eval(tokenizer, ScriptedBackend(tokenizer), problems[:2], tmp_path, n=1, datasets=six)
    assert set(summary["datasets"]) == set(six)
    assert summary["six_benchmark_avg"] == {"avg@n": 1.0, "maj@n": 1.0}
    assert all((tmp_path / f"{name}.jsonl").is_file() for name in six)
    assert json.loads((tmp_path / "summary.json").read_text())["six_benchmark_avg"]["avg@n"] == 1.0


class DeadServerBackend(ScriptedBackend):
    """A backend whose server went away: every generate raises, as the SGLang client does when
    its connection is refused (after its retries)."""

    async def generate(self, prompt_ids, sampling, stop):
        self.calls += 1
        raise ConnectionError("Cannot connect to host 127.0.0.1:30000 [Connection refused]")


class FlakyBackend(ScriptedBackend):
    """Fails the first problem's samples (a backend error mid-run), serves the others."""

    async def generate(self, prompt_ids, sampling, stop):
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        if "A stack of $n$ tokens" in prompt:
            raise ConnectionError("server reset the connection")
        return await super().generate(prompt_ids, sampling, stop)


def test_a_chunk_whose_samples_all_failed_stops_the_evaluation_naming_the_cause(tokenizer, problems, tmp_path):
    from stare_tir.eval.evaluate import EvalInfraError

    with pytest.raises(EvalInfraError, match=r"aime24: all 3 samples of a chunk failed .*Connection refused"):
        run_eval(tokenizer, DeadServerBackend(tokenizer), problems, tmp_path, n=2)
    rows = read_rows(tmp_path / "aime24.jsonl")  # written for the record, marked as failed
    assert len(rows) == 3 and all(r["rollout_error"] and "Connection refused" in r["error"] for r in rows)
    assert not (tmp_path / "summary.json").exists()  # no table of zeros

    again = ScriptedBackend(tokenizer)  # the server is back: failed samples are retried, never "done"
    m = run_eval(tokenizer, again, problems, tmp_path, n=2)["datasets"]["aime24"]
    assert again.first_turns == 8 and m["resumed_samples"] == 0
    assert m["avg@2"] == 1.0 and m["samples"] == 8 and m["rollout_error_samples"] == 0


def test_backend_errors_count_neither_as_right_nor_wrong(tokenizer, problems, tmp_path):
    m = run_eval(tokenizer, FlakyBackend(tokenizer), problems, tmp_path, n=1)["datasets"]["aime24"]
    # aime2024-I-3 failed (backend error): 3 problems graded, all right, one sample not graded.
    assert m["rollout_error_samples"] == 1 and m["samples"] == 3 and m["problems"] == 3
    assert m["avg@1"] == 1.0
    again = ScriptedBackend(tokenizer)
    m = run_eval(tokenizer, again, problems, tmp_path, n=1)["datasets"]["aime24"]
    assert again.first_turns == 1 and m["samples"] == 4 and m["rollout_error_samples"] == 0


def test_console_table_shows_fractions_like_training(tokenizer, problems, tmp_path):
    from stare_tir.eval.evaluate import format_table

    summary = run_eval(tokenizer, ScriptedBackend(tokenizer, offset=1), problems[:2], tmp_path, n=1)
    summary["datasets"]["aime24"]["avg@1"] = 0.5  # as if one of two were right
    head, _, row = format_table(summary).splitlines()
    assert head.split() == [
        "dataset",
        "probs",
        "N",
        "avg@N",
        "pass@1",
        "maj@N",
        "tools",
        "err",
        "tmo",
        "len",
        "infra_err",
    ]
    assert row.split()[3] == "0.500"  # a fraction, as in summary.json and eval/acc; never 50.0


def test_the_trainers_held_out_evaluation_records_an_outage_instead_of_stopping(tokenizer, problems, tmp_path):
    """A long training run must not die because one held-out evaluation met a server restart;
    its RL steps have their own guard (trainer.max_empty_steps). Nothing is graded, nothing scored."""
    from stare_tir.eval.evaluate import evaluate_problems

    sandbox = make_sandbox(SandboxConfig(workers=1))
    rollout = RolloutConfig(max_turns=2, max_total_tokens=256, max_new_tokens_per_turn=128, progress=False)
    backend = DeadServerBackend(tokenizer)
    engine = RolloutEngine(
        backend, tokenizer, make_retool_env_factory(sandbox, RetoolConfig()), rollout, sandbox=sandbox
    )
    try:
        metrics, rows = evaluate_problems(engine, problems[:2], 1, chunk_size=2, stop_on_infra_failure=False)
    finally:
        engine.close()
    assert backend.calls == 2 and metrics["samples"] == 0 and metrics["rollout_error_samples"] == 2
    assert all(r["rollout_error"] for r in rows)
