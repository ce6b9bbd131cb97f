"""envs.arithmetic: problem generation, splits, SFT traces (fake sandbox) and segment splitting."""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter

import pytest

from envs.arithmetic import (
    CODE_STYLES,
    ArithmeticConfig,
    direct_answer,
    evaluate,
    make_problems,
    make_sft_traces,
    split_assistant_segments,
    tool_turn,
)
from envs.retool import SHORT_SYSTEM_PROMPT, RetoolEnv
from sandbox.base import ExecResult, ExecStatus
from stare_tir.sft.config import ColdStartConfig


def test_problems_are_seeded_and_splits_disjoint():
    a = make_problems(300, seed=1, split="train")
    assert a == make_problems(300, seed=1, split="train")
    assert a != make_problems(300, seed=2, split="train")
    for seed in (0, 1, 2):
        train = {p["problem"] for p in make_problems(1000, seed, "train")}
        test = {p["problem"] for p in make_problems(200, seed, "test")}
        assert len(train) == 1000 and len(test) == 200 and not train & test
    ids = [p["id"] for p in a]
    assert len(set(ids)) == len(ids)


def test_problem_answers_and_difficulty():
    probs = make_problems(1000, seed=0, split="train")
    for p in probs:
        assert p["answer"] == str(evaluate(p["expr"])) and int(p["answer"]) >= 0
        assert p["kind"] in ("mul", "chain", "word", "easy")
        assert len(p["problem"]) <= 90  # short prompts for a tiny model
    kinds = Counter(p["kind"] for p in probs)
    assert kinds["mul"] > kinds["chain"] > kinds["easy"] > 0 and kinds["word"] > kinds["easy"]
    # Beyond a tiny model's head: most answers have 4+ digits (multi-digit products and sums).
    assert sum(len(p["answer"]) >= 4 for p in probs) / len(probs) > 0.7
    easy = [p for p in probs if p["kind"] == "easy"]
    assert all(len(p["answer"]) <= 2 for p in easy)


def test_kinds_subset_and_validation():
    probs = make_problems(50, seed=0, split="test", kinds=["mul"], max_digits=2)
    assert {p["kind"] for p in probs} == {"mul"}
    assert all(p["answer"] == str(int(p["expr"].split("*")[0]) * int(p["expr"].split("*")[1])) for p in probs)
    assert all(len(x) == 2 for p in probs for x in p["expr"].split("*"))
    with pytest.raises(ValueError, match="split"):
        make_problems(5, 0, "valid")
    with pytest.raises(ValueError, match="kinds"):
        ArithmeticConfig(kinds=["division"])
    with pytest.raises(ValueError, match="tool_fraction"):
        ArithmeticConfig(tool_fraction=1.5)
    with pytest.raises(ValueError, match="kind_weights"):
        ArithmeticConfig(kinds=["mul"], kind_weights=[1.0, 2.0])


def test_evaluate_matches_python():
    rng = random.Random(0)
    for _ in range(200):
        nums = [rng.randint(0, 999) for _ in range(4)]
        ops = [rng.choice("+-*") for _ in range(3)]
        expr = "".join(f"{n}{o}" for n, o in zip(nums, ops)) + str(nums[-1])
        assert evaluate(expr) == eval(expr), expr  # reference only: expr is built from ints here
    with pytest.raises(ValueError):
        evaluate("__import__('os')")


# ----------------------------------------------------------------------------- segments


def test_split_assistant_segments():
    obs = "\n<interpreter>\n42\n</interpreter>\n"
    text = "Let me.\n<code>\n```python\nprint(6*7)\n```\n</code>" + obs + "So \\boxed{42}"
    segs = split_assistant_segments(text)
    assert segs == [
        ("Let me.\n<code>\n```python\nprint(6*7)\n```\n</code>", True),
        (obs, False),
        ("So \\boxed{42}", True),
    ]
    assert "".join(s for s, _ in segs) == text
    two = "<code>a</code>" + obs + "<code>b</code>" + obs.replace("42", "x\n< /interpreter>\ny") + "end"
    segs = split_assistant_segments(two)
    assert [m for _, m in segs] == [True, False, True, False, True]
    assert "".join(s for s, _ in segs) == two
    # Text the model itself wrote in tag form (not after a code block) stays model-written (SFT then
    # refuses the row: tests/learner/test_learner_sft_masking.py).
    fake = "I will write <interpreter>42</interpreter> myself \\boxed{42}"
    assert split_assistant_segments(fake) == [(fake, True)]
    assert split_assistant_segments("") == []


# ----------------------------------------------------------------------------- traces (fake sandbox)


class _Session:
    def __init__(self, wrong: bool):
        self.wrong = wrong

    async def run(self, code, timeout=None):
        # The two code styles of the traces: print(EXPR), or x = EXPR then print(x).
        names: dict[str, int] = {}
        out = ""
        for line in code.splitlines():
            if m := re.fullmatch(r"(\w+) = (.+)", line):
                names[m[1]] = evaluate(m[2])
            elif m := re.fullmatch(r"print\((.+)\)", line):
                value = names[m[1]] if m[1] in names else evaluate(m[1])
                out += str(value + (1 if self.wrong else 0)) + "\n"
            else:
                raise AssertionError(f"the fake sandbox does not run {line!r}")
        return ExecResult(ExecStatus.OK, 0, None, out, "", False, False, 0.0)

    async def close(self):
        pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        pass


class _Sandbox:
    def __init__(self, wrong=False):
        self.wrong = wrong

    def session(self, stateless=False):
        return _Session(self.wrong)


def test_sft_traces_exact_format_and_mix():
    probs = make_problems(60, seed=0, split="train")
    traces = make_sft_traces(probs, _Sandbox(), tool_fraction=0.5, seed=3)
    assert traces == make_sft_traces(probs, _Sandbox(), tool_fraction=0.5, seed=3)  # deterministic
    n_tool = sum(t["uses_tool"] for t in traces)
    assert 15 < n_tool < 45
    for t, p in zip(traces, probs):
        system, user, assistant = t["messages"]
        assert (system["role"], user["role"], assistant["role"]) == ("system", "user", "assistant")
        assert system["content"] == SHORT_SYSTEM_PROMPT and user["content"] == p["problem"]
        if t["uses_tool"]:
            assert assistant["content"] == (
                tool_turn(p) + f"\n<interpreter>\n{p['answer']}\n</interpreter>\n" + f"\\boxed{{{p['answer']}}}"
            )
            assert [m for _, m in split_assistant_segments(assistant["content"])] == [True, False, True]
        else:
            assert assistant["content"] == direct_answer(p) and "<code>" not in assistant["content"]
    assert all(t["uses_tool"] for t in make_sft_traces(probs[:5], _Sandbox(), tool_fraction=1.0))
    assert not any(t["uses_tool"] for t in make_sft_traces(probs[:5], _Sandbox(), tool_fraction=0.0))


def test_sft_traces_refuse_wrong_tool_output():
    probs = make_problems(3, seed=0, split="train")
    with pytest.raises(RuntimeError, match="printed"):
        make_sft_traces(probs, _Sandbox(wrong=True), tool_fraction=1.0)


def test_make_sft_traces_inside_a_loop_points_to_async_version():
    async def inner():
        make_sft_traces([], _Sandbox())

    with pytest.raises(RuntimeError, match="amake_sft_traces"):
        asyncio.run(inner())


# ----------------------------------------------------------------------------- code styles


def test_code_styles_mix_in_the_configured_share():
    probs = make_problems(400, seed=0, split="train")
    mixed = make_sft_traces(probs, _Sandbox(), tool_fraction=1.0, seed=3, code_styles=["print", "assign"])
    assert mixed == make_sft_traces(probs, _Sandbox(), tool_fraction=1.0, seed=3, code_styles=["print", "assign"])
    counts = Counter(t["code_style"] for t in mixed)
    assert set(counts) == {"print", "assign"} and 0.4 < counts["assign"] / len(mixed) < 0.6
    for t, p in zip(mixed, probs):
        code = CODE_STYLES[t["code_style"]](p["expr"])
        assert t["messages"][2]["content"] == (
            f"<code>\n```python\n{code}\n```\n</code>"
            + f"\n<interpreter>\n{p['answer']}\n</interpreter>\n\\boxed{{{p['answer']}}}"
        )
    assert "x = " in mixed[[t["code_style"] for t in mixed].index("assign")]["messages"][2]["content"]
    # A repeated name weighs more: one assign in three.
    weighted = make_sft_traces(probs, _Sandbox(), tool_fraction=1.0, seed=3, code_styles=["print", "print", "assign"])
    assert 0.25 < sum(t["code_style"] == "assign" for t in weighted) / len(weighted) < 0.42
    # Styles do not move the tool/direct plan: the same traces call the tool as without styles.
    half = make_sft_traces(probs[:100], _Sandbox(), tool_fraction=0.5, seed=3, code_styles=["assign", "print"])
    plain = make_sft_traces(probs[:100], _Sandbox(), tool_fraction=0.5, seed=3)
    assert [t["uses_tool"] for t in half] == [t["uses_tool"] for t in plain]
    assert all(("code_style" in t) == t["uses_tool"] for t in half)


def test_both_code_styles_grade_correct():
    p = make_problems(1, seed=0, split="train")[0]
    obs = f"\n<interpreter>\n{p['answer']}\n</interpreter>\n"
    for style in ("print", "assign"):
        env = RetoolEnv(p, _Sandbox())
        reward, info = env.reward(tool_turn(p, style) + obs + f"\\boxed{{{p['answer']}}}")
        assert reward == 1.0 and info["correct"], style
        # Trace making grades every trace and raises on a wrong one: both styles pass it.
        (trace,) = make_sft_traces([p], _Sandbox(), tool_fraction=1.0, code_styles=[style])
        assert trace.get("code_style", "print") == style and tool_turn(p, style) in trace["messages"][2]["content"]


def test_default_code_style_keeps_traces_identical():
    probs = make_problems(60, seed=0, split="train")
    default = make_sft_traces(probs, _Sandbox(), tool_fraction=0.5, seed=3)
    assert default == make_sft_traces(probs, _Sandbox(), tool_fraction=0.5, seed=3, code_styles=["print"])
    assert all(set(t) == {"id", "messages", "uses_tool", "answer"} for t in default)
    tool = [(t, p) for t, p in zip(default, probs) if t["uses_tool"]]
    # The turn every trace wrote before styles existed, spelled out.
    assert all(t["messages"][2]["content"].startswith(f"<code>\n```python\nprint({p['expr']})\n```\n</code>") for t, p in tool)  # fmt: skip
    assert tool_turn(probs[0]) == f"<code>\n```python\nprint({probs[0]['expr']})\n```\n</code>"
    assert ColdStartConfig().code_styles == ["print"]


def test_unknown_code_style_is_refused_by_name():
    p = make_problems(1, seed=0, split="train")
    with pytest.raises(ValueError, match=r"unknown style\(s\) \['bogus'\]; known: \['assign', 'print'\]"):
        make_sft_traces(p, _Sandbox(), code_styles=["print", "bogus"])
    with pytest.raises(ValueError, match="unknown style"):
        tool_turn(p[0], "bogus")
    with pytest.raises(ValueError, match="bogus"):
        ColdStartConfig(code_styles=["bogus"])
    with pytest.raises(ValueError, match="non-empty list"):
        ColdStartConfig(code_styles=[])
    with pytest.raises(ValueError, match="non-empty list"):
        make_sft_traces(p, _Sandbox(), code_styles="print")
