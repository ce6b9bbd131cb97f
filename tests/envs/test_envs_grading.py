"""envs.grading: extraction, equivalence on labeled cases (incl. true negatives), time bounds."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs.grading import Grader, answers_equivalent, extract_answer, grade_answer, normalize_answer, parse_number

_spec = importlib.util.spec_from_file_location("grading_cases", Path(__file__).with_name("grading_cases.py"))
_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cases)
CASES = _cases.CASES


@pytest.mark.parametrize("gold,response,label,category", CASES, ids=[f"{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_labeled_case(gold, response, label, category):
    assert grade_answer(response, gold) is label


def test_case_suite_has_true_negatives_in_every_major_category():
    cats = {}
    for _, _, label, cat in CASES:
        cats.setdefault(cat, set()).add(label)
    for cat in (
        "integer",
        "decimal",
        "fraction",
        "percent",
        "units",
        "degrees",
        "pi",
        "root",
        "power",
        "scientific",
        "interval",
        "set",
        "tuple",
        "matrix",
        "relation",
        "expression",
        "extraction",
        "thousands",
    ):
        assert cats[cat] == {True, False}, cat
    assert sum(not c[2] for c in CASES) >= 80


# ----------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "response,expected",
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\frac{a}{b^{2}}}", r"\frac{a}{b^{2}}"),
        (r"\fbox{7}", "7"),
        (r"\boxed 5.", "5"),
        ("<answer>\n\\boxed{3}\n</answer>", "3"),
        ("\\boxed{9}\n<answer>\n\\boxed{3}\n</answer>", "3"),
        ("<answer> 12 </answer>", "12"),
        ("The final answer is $\\frac{3}{4}$. I hope it is correct.", r"\frac{3}{4}"),
        ("Final Answer: 17", "17"),
        ("$x = 3$", "$x = 3$"),
        ("42", "42"),
        (r"\boxed{2} and \boxed{3}", "2, 3"),
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    "response",
    [
        "",
        "I am not sure what the answer could be here, sorry.",
        r"The answer is \boxed{42",
        "Let me think.\nFirst we compute 3 + 4 = 7.\nThen more work follows.",
    ],
)
def test_extract_answer_none(response):
    assert extract_answer(response) is None


def test_unclosed_box_is_not_an_answer_and_grades_false():
    assert grade_answer(r"\boxed{42", "42") is False


@pytest.mark.parametrize(
    "raw,expected",
    [
        (r"\left( \frac{1}{2} \right)", r"( \frac{1}{2} )"),
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"10\%", "10"),
        (r"90^\circ", "90"),
        (r"5\text{ cm}", "5"),
        (r"7,425,000", "7425000"),
        (r"\$1,000.50", "1000.50"),
        (r"x \in [0, 1)", "[0, 1)"),
        (r"\frac12", r"\frac{1}{2}"),
        (r"\sqrt2", r"\sqrt{2}"),
        (r"1\,0\,0", "100"),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize(
    "text,value",
    [
        ("3", 3),
        ("-3", -3),
        ("0.5", 0.5),
        (".5", 0.5),
        ("1/4", 0.25),
        (r"\frac{3}{4}", 0.75),
        (r"-\frac{3}{4}", -0.75),
        ("2e3", 2000),
        (r"2 \times 10^{3}", 2000),
        ("4 1/2", 4.5),
        (r"2\frac{1}{2}", 2.5),
        ("1,000", 1000),
    ],
)
def test_parse_number(text, value):
    n = parse_number(text)
    assert n is not None and float(n.value) == value


@pytest.mark.parametrize("text", ["12 13", "x", r"\frac{1}{0}", "1/0", "3+4", "0,5"])
def test_parse_number_rejects(text):
    assert parse_number(text) is None


def test_answers_equivalent_directly():
    assert answers_equivalent(r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}")
    assert not answers_equivalent(r"\frac{\sqrt{2}}{2}", r"\sqrt{2}")


def test_gold_with_boxed_is_extracted():
    assert grade_answer(r"\boxed{5}", r"The answer is \boxed{5}.")


def test_interpreter_is_not_confused_with_answer_in_plain_grading():
    # grade_answer itself grades the last box wherever it is; RetoolEnv strips interpreter text.
    assert grade_answer("\\boxed{7}", "7")


# ----------------------------------------------------------------------------- bounds and speed


def test_numeric_answers_never_start_the_sympy_worker():
    g = Grader()
    try:
        for resp, gold in [
            (r"\boxed{204}", "204"),
            (r"\boxed{0.5}", r"\frac{1}{2}"),
            (r"\boxed{(1, 2)}", "(1,2)"),
            (r"\boxed{7}", "8"),
        ]:
            g.grade(resp, gold)
        assert g.stats["symbolic_calls"] == 0
        assert g._worker.proc is None
    finally:
        g.close()


def test_timeout_is_a_hard_bound_and_the_worker_recovers():
    # Two orderings of a 120-term polynomial: equal, but the comparison takes ~0.1 s of sympy.
    a = "+".join(f"x^{{{i}}}" for i in range(1, 121))
    b = "+".join(f"x^{{{i}}}" for i in range(120, 0, -1))
    g = Grader(timeout_s=10.0, cache_size=0)
    try:
        assert g.equivalent(r"\sqrt{8}", r"2\sqrt{2}")  # starts the worker
        t0 = time.monotonic()
        assert g.equivalent(a, b, timeout_s=0.005) is False  # gives up, kills the worker
        assert time.monotonic() - t0 < 1.0
        assert g.stats["timeouts"] == 1
        assert g.equivalent(a, b) is True  # a fresh worker answers again
    finally:
        g.close()


def test_pathological_inputs_return_quickly():
    g = Grader(timeout_s=2.0, cache_size=0)
    try:
        assert g.equivalent(r"\sqrt{8}", r"2\sqrt{2}")  # the worker's start-up is paid once, not here
        for resp, gold in [
            (r"\boxed{10^{10^{10}}}", "5"),
            (r"\boxed{100000!}", "3"),
            (r"\boxed{2^{2^{2^{2^{2}}}}}", "4"),
            ("\\boxed{" + "(" * 400 + "1" + ")" * 400 + "}", "1"),
            (r"\boxed{" + "x+" * 3000 + "1}", "1"),
        ]:
            t0 = time.monotonic()
            g.grade(resp, gold)
            assert time.monotonic() - t0 < 3.5, resp[:40]
    finally:
        g.close()


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 20000,
        "{" * 100000,
        "the answer is " * 8000,
        "\\boxed{" + "{" * 30000 + "}" * 30000 + "}",
        "\\boxed{1} " * 20000,
        "\\boxed{" + "\\{" * 5000 + "\\}" * 5000 + "}",
        "\\boxed{" + "1," * 50000 + "}",
        "\\boxed{" + "x=" * 30000 + "1}",
    ],
)
def test_extraction_is_linear_on_adversarial_text(text):
    t0 = time.monotonic()
    grade_answer(text, "5")
    assert time.monotonic() - t0 < 2.0


def test_model_text_cannot_execute_code_in_the_grader(tmp_path):
    marker = tmp_path / "pwned"
    evil = rf"\boxed{{__import__('os').system('touch {marker}')}}"
    assert grade_answer(evil, "0") is False
    evil2 = rf"\boxed{{open('{marker}', 'w')}}"
    assert grade_answer(evil2, "0") is False
    assert not marker.exists()


def test_grading_from_threads_is_bounded_and_correct():
    g = Grader(timeout_s=3.0)
    pairs = [
        (r"\boxed{\sqrt{12}}", r"2\sqrt{3}", True),
        (r"\boxed{x^2-1}", "(x-1)(x+1)", True),
        (r"\boxed{\pi}", r"2\pi", False),
        (r"\boxed{12}", "12", True),
    ] * 4
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            got = list(ex.map(lambda p: g.grade(p[0], p[1]), pairs))
        assert got == [p[2] for p in pairs]
    finally:
        g.close()


def test_cache_returns_the_same_verdict_without_recomputing():
    g = Grader(cache_size=16)
    try:
        assert g.equivalent(r"\sqrt{4}", "2")
        n = g.stats["symbolic_calls"]
        assert g.equivalent(r"\sqrt{4}", "2")
        assert g.stats["symbolic_calls"] == n
    finally:
        g.close()


def test_symbolic_off_falls_back_to_strings_and_numbers():
    g = Grader(symbolic=False)
    assert g.equivalent("0.5", r"\frac{1}{2}")
    assert not g.equivalent(r"\sqrt{4}", "2")  # would need algebra
    assert g._worker.proc is None


def test_light_imports():
    """`envs` (grading, data, the Retool env, the task, the reward-function seam) imports without the
    heavy stack: no torch, transformers, deepspeed or datasets, and sympy, math-verify and its LaTeX
    parser load only in the grading worker."""
    heavy = ("torch", "transformers", "deepspeed", "datasets", "sympy", "math_verify", "latex2sympy2_extended")
    code = (
        "import sys, envs.grading, envs.data, envs.retool, envs.arithmetic, envs.base, envs.reward; "
        f"bad = [m for m in {heavy!r} if m in sys.modules]; "
        "assert not bad, bad"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)
