"""envs.grading on the answer kinds a grader used to miss: per-kind labelled cases, the decimal
rule, the guard on math-verify's verdicts, the three grader modes, hang bounds and the env's metrics."""

from __future__ import annotations

import collections
import importlib.util
import time
from fractions import Fraction
from pathlib import Path

import pytest

from envs.grading import GRADERS, Grader
from envs.grading.extract import extract_answer
from envs.grading.numbers import decimal_matches_exact, numbers_equal, parse_number

_spec = importlib.util.spec_from_file_location(
    "grading_cases_kinds", Path(__file__).with_name("grading_cases_kinds.py")
)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
CASES = _mod.CASES

pytestmark = pytest.mark.xdist_group("grading_kinds")  # one worker process serves the module


@pytest.fixture(scope="module")
def grader():
    g = Grader(timeout_s=5.0)
    yield g
    g.close()


def test_every_kind_has_at_least_as_many_negatives_as_positives():
    count = collections.Counter((kind, label) for _, _, label, kind in CASES)
    kinds = {kind for _, _, _, kind in CASES}
    assert len(kinds) >= 14
    for kind in kinds:
        assert count[(kind, False)] >= count[(kind, True)] > 0, kind


@pytest.mark.parametrize("gold,response,label,kind", CASES, ids=[f"{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_kind_case(grader, gold, response, label, kind):
    assert grader.grade(response, gold) is label


# ----------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "response,expected",
    [
        ("The final answer is\n\\[\n9\n\\]", "9"),
        ("$$\n\\frac{1}{2}\n$$", "\\frac{1}{2}"),
        ("<think>\\boxed{5}</think>The final answer is $7$.", "7"),
        ("<think>\\boxed{5}</think>", "5"),  # nothing after the thinking: its answer counts
        ("\\boxed{7}<|im_end|>\n<|im_start|>user\n\\boxed{8}", "7"),
        ("\\boxed{(2,2)} \\quad \\text{and} \\quad \\boxed{(6,2)}", "(2,2), (6,2)"),
        ("First \\boxed{1}, then after checking \\boxed{2}", "2"),
        ("<code>\n```python\nprint('<|im_end|>')\n```\n</code>\nSo \\boxed{42}", "42"),  # a token in code
    ],
)
def test_extraction(response, expected):
    assert extract_answer(response) == expected


def test_boxed_mode_counts_only_boxed_answers():
    g = Grader("boxed", symbolic=False)
    assert g.grade("\\boxed{42}", "42")
    assert not g.grade("The final answer is $42$.", "42")
    assert not g.grade("42", "42")
    assert g.grade("<think>\\boxed{41}</think> so \\boxed{42}", "42")


# ----------------------------------------------------------------------------- decimal rule


@pytest.mark.parametrize(
    "dec,exact,ok",
    [
        ("0.0833333333333333", Fraction(1, 12), True),  # correct rounding, 15 significant digits
        ("0.666666666666667", Fraction(2, 3), True),
        ("0.666666666666666", Fraction(2, 3), False),  # a truncation, not a rounding
        ("0.333", Fraction(1, 3), False),  # too few digits to stand for 1/3
        ("0.5", Fraction(1, 2), True),  # the exact value itself
        ("0.14285715", Fraction(1, 7), False),
    ],
)
def test_decimal_against_exact(dec, exact, ok):
    assert decimal_matches_exact(parse_number(dec), exact) is ok


@pytest.mark.parametrize(
    "pred,gold,ok",
    [
        ("27.3912", "27.39", True),
        ("27.4", "27.39", False),
        ("27.39", "27.3912", False),
        ("0.54", "0.5", False),
        ("1.60", "1.6", True),
        ("0.124", "0.123", False),
    ],
)
def test_two_decimals(pred, gold, ok):
    assert numbers_equal(parse_number(pred), parse_number(gold)) is ok


# ----------------------------------------------------------------------------- guarded math-verify


def test_math_verify_false_positives_are_not_inherited(grader):
    # Each pair is accepted by math-verify 0.9 on its own (float rounding to 6 places, or a unit /
    # subscript dropped), and must stay "not equal" in the combined grader.
    from math_verify import parse, verify

    for gold, pred in [
        ("1.23456789", "1.23456788"),
        ("\\frac{2}{3}", "0.666666666666666"),
        ("\\frac{1}{3}", "0.333333"),
        ("6m", "6"),
        ("204_5", "204_6"),
    ]:
        assert verify(parse(f"${gold}$"), parse(f"\\boxed{{{pred}}}")), (gold, pred)
        assert not grader.grade(f"\\boxed{{{pred}}}", gold), (gold, pred)


def test_math_verify_stage_adds_recall_with_an_exact_recheck(grader):
    # Our own structure cannot read an expression of matrices; math-verify can, and our exact
    # re-check of its parsed matrices confirms (or refutes) its verdict.
    gold = "\\begin{pmatrix}3&0\\\\0&3\\end{pmatrix}"  # (not among CASES: no cached verdict)
    r = grader.check("\\boxed{3\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}}", gold)
    assert r.correct and r.stage == "math_verify"
    r = grader.check("\\boxed{3\\begin{pmatrix}1&0\\\\0&-1\\end{pmatrix}}", gold)
    assert not r.correct and r.stage == "math_verify"


def test_math_verify_mode_grades_like_math_verify():
    g = Grader("math_verify", timeout_s=5.0)
    try:
        assert g.grade("The answer is $\\boxed{\\frac{1}{2}}$", "0.5")
        assert g.grade("\\boxed{1.23456788}", "1.23456789")  # its own tolerance, by design
        assert not g.grade("\\boxed{3}", "4")
    finally:
        g.close()


def test_unknown_grader_is_a_clear_error():
    names = ", ".join(GRADERS.names())
    with pytest.raises(ValueError, match=f"unknown grader; choose one of {names}$"):
        Grader("sympy")
    from envs.retool import RetoolConfig

    with pytest.raises(ValueError, match="^grader='strict': unknown grader"):
        RetoolConfig(grader="strict")


@pytest.mark.parametrize("name", GRADERS.names())
def test_every_registered_grader_grades_by_its_name(name):
    """Each entry, whatever registered it, is built by name and answers a plain case."""
    g = Grader(name, symbolic=False)
    try:
        assert g.grade("so \\boxed{7}", "7") is True and g.grade("so \\boxed{8}", "7") is False
    finally:
        g.close()


def test_a_registered_grader_is_selectable_by_its_name_alone():
    """The config's allowed names are the registry's: a grader added at run time is accepted."""
    from envs.grading.grader import BuiltinGrading
    from envs.retool import RetoolConfig

    class FirstWordGrading(BuiltinGrading):
        def check(self, grader, response, gold, timeout_s):
            pred = response.split()[0]
            return pred == gold, "fast", pred

    with GRADERS.temporarily("first_word", FirstWordGrading):
        assert RetoolConfig(grader="first_word").grader == "first_word"
        g = Grader("first_word", symbolic=False)
        assert g.grade("7 apples", "7") and not g.grade("\\boxed{7}", "7")
    with pytest.raises(ValueError, match="unknown grader"):
        RetoolConfig(grader="first_word")


# ----------------------------------------------------------------------------- bounds


@pytest.mark.parametrize("mode", ["builtin", "math_verify"])
def test_adversarial_answers_return_within_the_bound(mode):
    g = Grader(mode, timeout_s=1.5, cache_size=0)
    try:
        assert g.grade(r"\boxed{\sqrt{8}}", r"2\sqrt{2}")  # start-up paid once, before timing
        for text in [
            r"\boxed{2^{2^{2^{2^{2^{2^{2}}}}}}}",
            r"\boxed{9^{9^{9^{9}}}}",
            "\\boxed{" + "\\sqrt{" * 80 + "2" + "}" * 80 + "}",
        ]:
            t0 = time.monotonic()
            r = g.check(text, "5")
            assert time.monotonic() - t0 < 1.5 + 1.0, text[:30]
            assert r.correct is False
    finally:
        g.close()


def test_a_timeout_is_reported_in_the_result():
    g = Grader(timeout_s=0.3, cache_size=0)
    try:
        assert g.grade(r"\boxed{\sqrt{8}}", r"2\sqrt{2}")
        poly = "+".join(f"x^{{{i}}}" for i in range(1, 101))  # (both sides under MAX_WORKER_CHARS)
        r = g.check("\\boxed{" + poly + "}", "+".join(f"x^{{{i}}}" for i in range(100, 0, -1)), timeout_s=0.01)
        assert r.timed_out and r.stage == "timeout" and not r.correct
        assert g.stats["timeouts"] == 1 and g.stats["seconds"] > 0
    finally:
        g.close()


# ----------------------------------------------------------------------------- env metrics


def test_env_reward_reports_grading_time_and_timeouts():
    from envs.retool import RetoolConfig, RetoolEnv

    env = RetoolEnv({"id": "p", "problem": "2+2?", "answer": "4"}, sandbox=None, cfg=RetoolConfig(grader="boxed"))
    reward, info = env.reward("so it is \\boxed{4}")
    assert reward == 1.0 and info["correct"] and info["grade_timeout"] is False
    assert 0.0 < info["grade_s"] < 1.0
    _, info = env.reward("The final answer is 4.")  # not boxed: no answer under this grader
    assert not info["correct"] and not info["has_answer"]
