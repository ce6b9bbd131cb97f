"""envs.grading on where answers are read from, several answers, answers equal by form, exact
values that are merely close, and the decimal rule's switch."""

from __future__ import annotations

import collections
import importlib.util
from fractions import Fraction
from pathlib import Path

import pytest

from envs.grading import Grader, get_grader
from envs.grading.extract import extract_answer
from envs.grading.forms import base_numeral, clock_seconds, percent_rate_equal, words_number
from envs.grading.numbers import numbers_equal, parse_number


def _load(name: str) -> list[tuple[str, str, bool, str]]:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CASES


CASES = _load("grading_cases_prose_forms")
KINDS = {
    "prose_span",
    "answer_is",
    "gsm8k",
    "option",
    "worked",
    "think_final",
    "multi_answer",
    "pm_set",
    "labelled_sets",
    "base",
    "percent_rate",
    "clock",
    "function",
    "reorder",
    "solved",
    "trig",
    "words",
    "sci",
    "closeness",
}

pytestmark = pytest.mark.xdist_group("grading_prose_forms")  # one worker process serves the module


@pytest.fixture(scope="module")
def grader():
    g = Grader(timeout_s=5.0)
    yield g
    g.close()


def test_every_kind_has_cases_and_more_negatives():
    count = collections.Counter((kind, label) for _, _, label, kind in CASES)
    assert {kind for *_, kind in CASES} == KINDS
    for kind in KINDS:
        assert count[(kind, False)] >= count[(kind, True)] > 0, kind


@pytest.mark.parametrize("gold,response,label,kind", CASES, ids=[f"{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_prose_forms_case(grader, gold, response, label, kind):
    assert grader.grade(response, gold) is label


HELD_OUT = _load("grading_cases_heldout")


def test_held_out_cases_are_never_false_positives(grader):
    # The held-out cases score the grader apart (scripts/bench_grading.py); a miss there is
    # reported, but accepting a wrong answer is never acceptable in a reward.
    count = collections.Counter((kind, label) for _, _, label, kind in HELD_OUT)
    assert all(count[(kind, False)] >= count[(kind, True)] for kind, _ in count)
    wrong = [(gold, resp) for gold, resp, label, _ in HELD_OUT if not label and grader.grade(resp, gold)]
    assert wrong == []


# ----------------------------------------------------------------------------- where the answer is


@pytest.mark.parametrize(
    "response,expected",
    [
        ("Therefore $x \\geq 5$ is the solution.", "x \\geq 5"),
        ("So the answers are $-3$ and $5$.", "-3, 5"),
        ("The total cost is $\\$10$.", "\\$10"),  # an escaped dollar is no delimiter
        ("He has 6 * 7 = <<6*7=42>>42 marbles.\n#### 42", "42"),
        ("The correct option is (B).", "B"),
        ("Therefore, the correct answer is option A.", "A"),
        ("答案：D", "D"),
        ("综上所述，故选 D", "D"),
        ("So the answer is 12 apples.", "12"),
        ("The meeting starts at 15:00.", "15:00"),
        ("Dividing by $2$, we get $x = \\frac{5}{2}$.\nThis completes the solution.", "x = \\frac{5}{2}"),
        ("x = \\boxed{-2} \\text{ or } x = \\boxed{3}", "-2, 3"),
        ("<think>\\boxed{5}</think>\n\n", "5"),  # nothing after the thinking: its answer stands
        ("<think>\nSo it's \\boxed{5}.\n</think>\n<|im_end|>", "5"),
    ],
)
def test_extraction_reads_the_answer(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    "response",
    [
        "<think>so \\boxed{5}</think>\nLet me verify this with code first.",  # not final
        "I don't know what the answer is. It might be 6 or 7.",
        "Let us check if the answer is 5 by substituting it back.",
        "The answer is not $5$.",
        "Is $n = 7$ the smallest such value?",
        "Find all $x$ with $x^2 = 25$.",
        "Next we would divide both sides, but first let us check the domain of $x$.",
        "Expanding the product, we get $x = 5$, which means",  # cut off mid-sentence
        "We add the four parts one by one.\nThus the total is 1",  # cut off: "1" may be "12..."
        "So $x = 5$.\n<code>\nprint(5 * 2)\n</code>",  # the response goes on computing
        "The answer is \\boxed{42",
    ],
)
def test_extraction_finds_no_answer_where_none_is_concluded(response):
    assert extract_answer(response) is None


def test_a_boxed_answer_in_the_thinking_does_not_win_over_the_text_after_it(grader):
    response = "<think>I get \\boxed{5}.</think>\nHmm, the problem is underspecified."
    assert extract_answer(response) is None
    r = grader.check(response, "5")
    assert not r.correct and r.stage == "none"


def test_extraction_stays_linear_on_unclosed_delimiters():
    import time

    for text in ["\\[" * 50000, "\\(" * 50000, "$" * 100001, "So " + "$x " * 30000]:
        t0 = time.monotonic()
        extract_answer(text)
        assert time.monotonic() - t0 < 2.0


# ----------------------------------------------------------------------------- forms


@pytest.mark.parametrize(
    "words,value",
    [
        ("twenty-five", 25),
        ("one thousand twenty-one", 1021),
        ("Three hundred", 300),
        ("a hundred", 100),
        ("negative three", -3),
        ("zero", 0),
        ("ninety nine thousand nine hundred ninety nine", 99999),
        ("twenty twenty", None),
        ("five six", None),
        ("zero one", None),
        ("none", None),
        ("one hundred thousand million", None),
    ],
)
def test_words_number(words, value):
    assert words_number(words) == value


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("20:34", 74040),
        ("20:34:00", 74040),
        ("08:34 P.M", 74040),
        ("12:05 AM", 300),
        ("12:30 pm", 45000),
        ("2:3", None),  # a ratio, not a time
        ("25:00", None),
        ("13:00 PM", None),
        ("9:60", None),
    ],
)
def test_clock_seconds(text, seconds):
    assert clock_seconds(text) == seconds


def test_base_numerals_are_digits_and_a_base_not_a_name_with_a_subscript():
    assert base_numeral("4210_{7}") == base_numeral("4210_7") == ("4210", 7)
    assert base_numeral("BEAD_{16}") == ("BEAD", 16)
    assert base_numeral("a_{10}") is None and base_numeral("x_1") is None and base_numeral("AB_{7}") is None


@pytest.mark.parametrize(
    "pred,gold,equal",
    [
        ("25\\%", "0.25", True),
        ("0.25", "25\\%", True),
        ("12.5 percent", "\\frac{1}{8}", True),
        ("2.5\\%", "0.25", False),
        ("0.28", "28", False),  # no percent sign: not this rule
        ("200\\%", "2", False),  # "2" is no plain rate (it may mean 2%)
        ("25\\%", "25\\%", False),  # both percents: decided elsewhere
    ],
)
def test_percent_against_a_plain_rate(pred, gold, equal):
    assert percent_rate_equal(pred, gold) is equal


# ----------------------------------------------------------------------------- exact values


def test_exact_comparison_never_accepts_a_close_value():
    import sympy

    from envs.grading._exact import const_is_zero, exprs_equal, proportional

    x = sympy.Symbol("x")
    tiny_root = sympy.Pow(2, sympy.Rational(1, 2**1000))
    assert not exprs_equal(tiny_root, sympy.Integer(1))
    assert not exprs_equal(sympy.Rational(99999999, 10**8), sympy.Rational(99999998, 99999999))
    assert not exprs_equal(sympy.pi, sympy.Rational(4272943, 1360120))
    assert not exprs_equal(x**2 + sympy.Rational(1, 10**20), x**2)
    assert not exprs_equal(sympy.sin(sympy.pi * x), sympy.Integer(0))
    assert not proportional(x + sympy.Rational(1, 10**20), x, positive=True)
    # ... while exact equalities are proved.
    assert const_is_zero(sympy.sqrt(5 + 2 * sympy.sqrt(6)) - sympy.sqrt(2) - sympy.sqrt(3))
    assert exprs_equal(sympy.log(8), 3 * sympy.log(2))
    assert exprs_equal(sympy.sin(x) ** 2 + sympy.cos(x) ** 2, sympy.Integer(1))
    assert exprs_equal(sympy.sqrt(x**2), sympy.Abs(x)) and not exprs_equal(sympy.sqrt(x**2), x)
    assert proportional(2 * x - 4, x - 2, positive=True) and not proportional(2 * x - 4, 2 - x, positive=True)


def test_a_decimal_equals_an_irrational_value_only_as_its_full_precision_rounding():
    import sympy

    from envs.grading._exact import decimal_vs_expr

    assert decimal_vs_expr(parse_number("1.41421356237310"), sympy.sqrt(2))
    assert not decimal_vs_expr(parse_number("1.41421356237309"), sympy.sqrt(2))  # a truncation
    assert not decimal_vs_expr(parse_number("1.0"), sympy.Pow(2, sympy.Rational(1, 2**1000)))
    assert decimal_vs_expr(parse_number("3.0"), sympy.log(8) / sympy.log(2))  # a rational value


# ----------------------------------------------------------------------------- the decimal rule's switch


@pytest.mark.parametrize(
    "pred,gold",
    [
        ("27.3912", "27.39"),
        ("6.022e23", "6.02e23"),
        ("\\begin{pmatrix}27.3912\\end{pmatrix}", "\\begin{pmatrix}27.39\\end{pmatrix}"),
    ],
)
def test_finer_decimals_is_a_switch(pred, gold):
    assert get_grader("builtin").equivalent(pred, gold)
    strict = get_grader("builtin", finer_decimals=False)
    assert not strict.equivalent(pred, gold)
    assert strict.equivalent(gold, gold)


def test_finer_decimals_reaches_the_worker_stages(grader):
    # An expression of matrices goes to the worker (our structure cannot read it) and through the
    # guarded math-verify stage: the switch must reach its exact re-check of the parsed floats.
    # (27.3900001 and 27.39: math-verify calls them equal, its floats agree to 6 decimals.)
    finer, coarse = "2\\begin{pmatrix}13.69500005\\end{pmatrix}", "2\\begin{pmatrix}13.695\\end{pmatrix}"
    strict = get_grader("builtin", finer_decimals=False)
    calls = strict.stats["symbolic_calls"]
    assert grader.equivalent(finer, "\\begin{pmatrix}27.39\\end{pmatrix}")
    assert not strict.equivalent(finer, "\\begin{pmatrix}27.39\\end{pmatrix}")
    assert strict.stats["symbolic_calls"] == calls + 1
    # The rule reads gold and prediction in their places: a coarser prediction never passes.
    assert not grader.equivalent(coarse, "\\begin{pmatrix}27.3900001\\end{pmatrix}")


def test_two_decimals_compare_by_value_without_the_switch():
    strict = dict(finer_decimals=False)
    assert numbers_equal(parse_number("1.60"), parse_number("1.6"), **strict)
    assert not numbers_equal(parse_number("27.3912"), parse_number("27.39"), **strict)
    assert numbers_equal(parse_number("0.5"), parse_number("\\frac{1}{2}"), **strict)
    assert parse_number("6.02e23").value == Fraction(602) * 10**21


def test_env_config_selects_the_decimal_rule():
    from envs.retool import RetoolConfig, RetoolEnv

    problem = {"id": "p", "problem": "Round to two decimals.", "answer": "27.39"}
    default = RetoolEnv(problem, sandbox=None, cfg=RetoolConfig())
    strict = RetoolEnv(problem, sandbox=None, cfg=RetoolConfig(grade_finer_decimals=False))
    assert default.reward("so \\boxed{27.3912}")[1]["correct"]
    assert not strict.reward("so \\boxed{27.3912}")[1]["correct"]
    assert strict.reward("so \\boxed{27.39}")[1]["correct"]


# ----------------------------------------------------------------------------- the math_verify grader


def test_math_verify_grader_reports_its_own_extraction_and_compares_pairs():
    g = Grader("math_verify", timeout_s=5.0)
    try:
        r = g.check("We get 3 and then the result is $\\frac{1}{2}$", "0.5")
        assert r.correct and r.pred is not None and "frac" in r.pred
        assert g.equivalent("1.23456788", "1.23456789")  # its float tolerance, by design
        assert not g.equivalent("3", "4")
    finally:
        g.close()
