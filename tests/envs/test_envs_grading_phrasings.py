"""envs.grading on the ways a response phrases a right answer (chat-template tails, the Minerva
answer line, glued units, solution sets, formulas, damaged boxes, calculus in sympy or LaTeX
form) and on unit traps; each rule also on its own."""

from __future__ import annotations

import collections
import importlib.util
from fractions import Fraction
from pathlib import Path

import pytest

from envs.grading import Grader
from envs.grading.commutative import canonical, same_up_to_order
from envs.grading.equivalence import normalize_answer, parse_structure, solution_count
from envs.grading.extract import boxed_set, extract_answer, option_in_prose
from envs.grading.extract_prose import glued_number
from envs.grading.latex_expr import numerically_different
from envs.grading.structure import _matrix_sum
from envs.grading.units import quantities_equal, read_quantity, unit_after, without_unit

_spec = importlib.util.spec_from_file_location(
    "grading_cases_phrasings", Path(__file__).with_name("grading_cases_phrasings.py")
)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
CASES = _mod.CASES
KINDS = {
    "template_tail",
    "minerva_line",
    "glued_unit",
    "solution_set",
    "formula",
    "damaged_box",
    "calculus",
    "unit_trap",
}

pytestmark = pytest.mark.xdist_group("grading_phrasings")  # one worker process serves the module


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
def test_phrasing_case(grader, gold, response, label, kind):
    assert grader.grade(response, gold) is label


# ----------------------------------------------------------------------------- where the turn ends


@pytest.mark.parametrize(
    "response,expected",
    [
        ("So it is $7$.<end_of_turn>\n<start_of_turn>user\nAnd 8?", "7"),
        ("Sum: \\boxed{12}<｜end▁of▁sentence｜><｜User｜>again<｜Assistant｜>\\boxed{13}", "12"),
        ("The answer is $2$.\n<|user|>\nWhy?\n<|assistant|>\nThe answer is $3$.", "2"),
        ("The answer is $2$.</s>[INST] next [/INST] The answer is $3$.", "2"),
        ("So the answer is $9$.\n\nHuman: and 3+3?\n\nAssistant: The answer is 6.", "9"),
        ("So the answer is $9$.\n### Instruction: more\nThe answer is 6.", "9"),
        # A token printed by code is program text, not the end of the turn.
        ("<code>\n```python\nprint('<|user|>')\n```\n</code>\nSo the answer is \\boxed{4}.", "4"),
    ],
)
def test_turn_text_after_the_answer_is_dropped(response, expected):
    assert extract_answer(response) == expected


def test_a_speaker_line_while_thinking_ends_nothing():
    response = "<think>The task reads:\nUser: find x with 2x = 10.\nSo x = 5.</think>\nThe answer is $5$."
    assert extract_answer(response) == "5"


def test_a_speaker_line_needs_text_before_it():
    # "User:" opening the response ends nothing: the answer after it is read.
    assert extract_answer("User: the problem.\nThe answer is $5$.") == "5"


@pytest.mark.parametrize(
    "response,expected",
    [
        ("Final Answer: The final answer is $12,340$. I hope it is correct.", "12,340"),
        ("Final Answer: The final answer is 4.I hope it is correct.", "4"),
        ("Final Answer: The final answer is 7/2. I hope it is correct.", "7/2"),
        ("Final Answer: The final answer is $\\boxed{45}$. I hope it is correct.", "45"),
    ],
)
def test_the_minerva_answer_line(response, expected):
    assert extract_answer(response) == expected


# ----------------------------------------------------------------------------- numbers with units


@pytest.mark.parametrize(
    "response,expected",
    [
        ("Thus each box weighs 18kg.", "18 kg"),
        ("The rectangle has an area of 3.5m².", "3.5 m²"),
        ("Therefore the car travels at 60km/h.", "60 km/h"),
        ("Adding the fees, the bill comes to 2,500.75€.", "2,500.75"),
        ("So the trip costs 1,200USD in total.", "1,200"),
        ("So the answer is 7.2m/s.", "7.2 m/s"),
        ("The distance is 5 miles.", "5 miles"),
        ("So the answer is 12 apples.", "12"),  # not a unit: the number alone, as before
        ("So the answer is 4 in total.", "4"),  # "in" that runs on is a word, not inches
    ],
)
def test_a_unit_glued_or_spelled_stays_with_its_number(response, expected):
    assert extract_answer(response) == expected


def test_glued_number_reads_only_known_units():
    assert glued_number("7.2m/s") == "7.2 m/s"
    assert glued_number("2,500.75€") == "2,500.75"
    assert glued_number("3rd") is None and glued_number("x2") is None
    assert unit_after(" meters per second long") == "meters per second"
    assert unit_after(" apples") is None


@pytest.mark.parametrize(
    "text,number,dim,scale",
    [
        ("10 m", "10", (("L", 1),), Fraction(1)),
        ("10 \\text{ cm}", "10", (("L", 1),), Fraction(1, 100)),
        ("5000\\,\\mathrm{g}", "5000", (("M", 1),), Fraction(1, 1000)),
        ("12 \\text{ cm}^2", "12", (("L", 2),), Fraction(1, 10000)),
        ("36 km/h", "36", (("L", 1), ("T", -1)), Fraction(5, 18)),
        ("3 square feet", "3", (("L", 2),), Fraction(3048, 10000) ** 2),
        ("9.8 meters per second", "9.8", (("L", 1), ("T", -1)), Fraction(1)),
        ("3\\pi m", "3\\pi", (("L", 1),), Fraction(1)),
        ("2 hours", "2", (("T", 1),), Fraction(3600)),
        ("0.8 \\mathrm{~V}", "0.8", (("V", 1),), Fraction(1)),  # a letter in \\mathrm is a unit
        ("5\\text{ N}", "5", (("N", 1),), Fraction(1)),
    ],
)
def test_read_quantity(text, number, dim, scale):
    q = read_quantity(text)
    assert q is not None and (q.number, q.dim, q.scale) == (number, dim, scale)


@pytest.mark.parametrize(
    "text", ["6m", "2x^2", "25\\%", "5 apples", "x = 3 m", "10", "\\frac{1}{2}", "2 t", "3 L", "5 N", "2 A"]
)
def test_read_quantity_refuses_what_is_no_quantity(text):
    assert read_quantity(text) is None


@pytest.mark.parametrize(
    "pred,gold,expected",
    [
        ("10 cm", "10 m", False),
        ("1000 cm", "10 m", True),
        ("5 g", "5 kg", False),
        ("5000 g", "5 kg", True),
        ("10 m/s", "36 km/h", True),
        ("1200 mm^2", "12 cm^2", True),
        ("12 cm", "12 cm^2", False),  # another dimension
        ("10 s", "10 m", False),
        ("2.54 cm", "1 in", True),
        ("27.3912 m", "27.39 m", True),  # the same unit: the decimal rule
        ("27.4 m", "27.39 m", False),
        ("3\\pi cm", "3\\pi m", False),  # an expression in another unit: not equal
        ("3\\pi m", "3\\pi m", None),  # an expression in the same unit: the other stages decide
        ("10", "10 m", None),  # one side without a unit: decided elsewhere
        ("2 months", "60 days", False),  # a month has no fixed length
    ],
)
def test_quantities_equal(pred, gold, expected):
    assert quantities_equal(pred, gold) is expected


def test_a_letter_that_may_be_a_variable_is_kept(grader):
    assert not grader.equivalent("2 t", "2")
    assert not grader.equivalent("5 N", "5")
    assert grader.equivalent("0.8 \\mathrm{~V}", "0.8")


def test_without_unit_drops_the_one_sided_unit():
    assert without_unit("0.8 \\mathrm{V}", "0.8") == ("0.8", "0.8")
    assert without_unit("2 t", "2") == ("2 t", "2")  # "t" spaced, not in \\text: a variable
    assert without_unit("7", "7 \\text{ cm}") == ("7", "7")
    assert without_unit("10 m", "10 cm") == ("10 m", "10 cm")


@pytest.mark.parametrize(
    "pred,gold,expected",
    [
        ("25", "25\\%", True),  # the percent convention: a percent equals the number it writes
        ("0.25", "25\\%", True),  # ... and the rate it names
        ("2.5", "25\\%", False),
        ("25", "0.25", False),  # a bare number is never its own rate
        ("0.4", "40 percent", True),
    ],
)
def test_the_percent_convention_holds(grader, pred, gold, expected):
    assert grader.equivalent(pred, gold) is expected


# ----------------------------------------------------------------------------- solution sets


def test_semicolons_separate_tuple_and_set_items():
    assert parse_structure("(0;1;2)") == ("seq", "(", ")", [("scalar", "0"), ("scalar", "1"), ("scalar", "2")])
    assert parse_structure(normalize_answer("\\{3; 1\\}")) == ("set", [("scalar", "3"), ("scalar", "1")])
    # With a comma present the comma separates (a semicolon inside an item stays there).
    assert parse_structure("(1,2)")[0] == "seq"


def test_the_plus_minus_glyph_is_pm():
    assert normalize_answer("±7") == "\\pm 7"


def test_solution_count():
    assert solution_count("\\{2, 5\\}") == 2
    assert solution_count("1, 4") == 2
    assert solution_count("\\pm 7") == 2
    assert solution_count("(1, 2)") == 0  # a tuple is one answer
    assert solution_count("7") == 0


@pytest.mark.parametrize(
    "response,n,expected",
    [
        ("The first root is \\boxed{-1}. The second root is \\boxed{3}.", 2, "-1, 3"),
        ("\\boxed{1} then \\boxed{2} and \\boxed{3}", 2, "2, 3"),
        ("So \\boxed{2}. Wait, that is wrong: \\boxed{5}.", 2, None),  # a correction
        ("I get \\boxed{2}, but actually \\boxed{5}.", 2, None),
        ("\\boxed{5} and again \\boxed{5}", 2, None),  # not distinct
        ("\\boxed{1, 2} and \\boxed{3}", 2, None),  # a box holding several values
        ("Only \\boxed{4}.", 2, None),
        ("\\boxed{1} and \\boxed{2}", 1, None),
    ],
)
def test_boxed_set(response, n, expected):
    assert boxed_set(response, n) == expected


# ----------------------------------------------------------------------------- formulas


@pytest.mark.parametrize(
    "a,b,expected",
    [
        ("a_k b_{n-k}", "b_{n-k} a_k", True),
        ("\\sum_{k=0}^{n} a_k b_{n-k}", "\\sum_{k=0}^{n} b_{n-k} a_k", True),
        ("xy+2z", "2z+yx", True),
        ("(a+b)(c+d)", "(d+c)(b+a)", True),
        ("-b+a", "a-b", True),
        ("a-b", "b-a", False),
        ("\\sum_{k=0}^{n} a_k", "\\sum_{k=1}^{n} a_k", False),
        ("AB", "BA", False),  # capitals may be matrices: never reordered
        ("\\sin x \\cos y", "\\cos x \\sin y", False),  # a function's argument follows it
        ("\\sum_k a_k + b", "b + \\sum_k a_k", False),  # where a sum's body ends is not reordered
        ("a_1 b", "a_{1b}", False),
    ],
)
def test_same_up_to_order(a, b, expected):
    assert same_up_to_order(a, b) is expected


def test_canonical_refuses_what_may_not_commute():
    assert canonical("AB") is None
    assert canonical("\\frac{a}{b}") is None
    assert canonical("2a") == "+2·a"


@pytest.mark.parametrize(
    "pred,gold,expected",
    [
        ("\\lim_{x\\to0} \\frac{\\sin x}{x} = 1", "1", True),
        ("\\det M = 3", "3", True),
        ("\\int_0^1 x^2\\,dx = \\frac{1}{3}", "\\frac{1}{3}", True),
        ("\\frac{d}{dx}x^3 = 3x^2", "3x^2", True),
        ("\\sum_{k=1}^{n} k = \\frac{n(n+1)}{2}", "\\frac{n(n+1)}{2}", True),
        ("E[X] = 2", "2", True),
        ("\\lim_{x\\to0} \\frac{\\sin x}{x} = 1", "0", False),
        ("x + 1 = 6", "6", False),  # an equation in x states no value 6
    ],
)
def test_an_operation_then_its_value(grader, pred, gold, expected):
    assert grader.equivalent(pred, gold) is expected


def test_a_matrix_sum_is_evaluated():
    summed = parse_structure(
        "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}-\\begin{pmatrix}1&1\\\\1&\\frac{1}{2}\\end{pmatrix}"
    )
    assert summed == ("matrix", [["0", "1"], ["2", "7/2"]])
    with_symbols = parse_structure("\\begin{pmatrix}a\\end{pmatrix}+\\begin{pmatrix}1\\end{pmatrix}")
    assert with_symbols == ("matrix", [["(a)+(1)"]])
    # Shapes that differ, or anything between the matrices but signs: no sum.
    assert _matrix_sum("\\begin{pmatrix}1&2\\end{pmatrix}+\\begin{pmatrix}1\\end{pmatrix}") is None
    assert _matrix_sum("\\begin{pmatrix}1\\end{pmatrix}x\\begin{pmatrix}1\\end{pmatrix}") is None
    assert _matrix_sum("\\begin{pmatrix}1\\end{pmatrix}") is None


@pytest.mark.parametrize(
    "a,b",
    [
        ("x^2+2x-1", "x^2+2x+1"),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{\\sqrt{3}}{2}"),
        ("\\sqrt{x^2}", "x"),  # differs at a negative point
        ("\\log(x^2)", "2\\log x"),
        ("a_{n+1}", "a_{n-1}"),
        ("0.333", "\\frac{1}{3}"),  # a short decimal is not the exact value (the decimal rule)
    ],
)
def test_numerically_different_rejects(a, b):
    assert numerically_different(a, b)


@pytest.mark.parametrize(
    "a,b",
    [
        ("\\sin^2 x+\\cos^2 x", "1"),
        ("2\\sin x\\cos x", "sin(2*x)"),
        ("(x+1)^2", "x^2+2x+1"),
        ("factorial(n)/factorial(n+1)", "\\frac{1}{n+1}"),
        ("e^{i\\pi}", "-1"),
        ("0.333333333333", "\\frac{1}{3}"),  # 12 digits: left to the decimal rule in the worker
        ("9^{9^{9^{9}}}", "1"),  # overflows: undecided, never a hang
        ("100000000!", "5"),  # factorial notation: undecided
        ("\\int_0^1 x dx", "\\frac12"),  # not translated: undecided
    ],
)
def test_numerically_different_never_rejects_an_equal_or_unreadable_pair(a, b):
    assert not numerically_different(a, b)


def test_a_subscript_keeps_its_operators(grader):
    # Our sympy translator read a_{n+1} and a_{n-1} as the same symbol.
    assert not grader.equivalent("a_{n+1}", "a_{n-1}")
    assert not grader.equivalent("x_{1,2}", "x_{12}")
    assert grader.equivalent("a_{n+1} + 1", "1 + a_{n+1}")


def test_an_integral_is_not_an_element_sign():
    # "x \\in [0, 1)" drops "x \\in"; "\\int" is no "\\in".
    assert normalize_answer("x \\in [0, 1)") == "[0, 1)"
    assert normalize_answer("\\int_0^1 x dx").startswith("\\int")


@pytest.mark.parametrize(
    "pred,gold,expected",
    [
        ("factorial(n)/factorial(n+1)", "\\frac{1}{n+1}", True),
        ("sin(x)**2+cos(x)**2", "1", True),
        ("Abs(x)", "|x|", True),
        ("asin(1)", "\\frac{\\pi}{2}", True),
        ("factorial(n)/factorial(n+1)", "\\frac{1}{n}", False),
    ],
)
def test_sympy_spelling(grader, pred, gold, expected):
    assert grader.equivalent(pred, gold) is expected


# ----------------------------------------------------------------------------- damaged boxes


@pytest.mark.parametrize(
    "response,expected",
    [
        ("so the answer is boxed {77}.", "77"),
        ("we obtain \\beginboxed{42}.", "42"),
        ("the count is □{15}.", "15"),
        ("the count is \\Box{15}.", "15"),
        ("First the pairs: 15 of them.\nSo 15 times 7.\n\n105", "105"),
        ("First the pairs.\nThen the rest.\n**105**", "105"),
        ("First the pairs.\nThen the rest.\n$\\frac{3}{4}$", "\\frac{3}{4}"),
    ],
)
def test_a_damaged_box_or_a_last_line_is_read(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    "response",
    [
        "We need the smallest value.\nSo far the candidates are 12 and 18.\n\n3.",  # a list marker
        "Let me run it.\n<code>\n```python\nprint(42)\n```\n</code>\n<interpreter>\n42\n</interpreter>",
        "The boxed region has area 4 and the rest is unknown, I think",
    ],
)
def test_no_last_line_answer(response):
    assert extract_answer(response) is None


@pytest.mark.parametrize(
    "response,expected",
    [
        ("Option A fails and C is too large. I think it's B.", "B"),
        ("A, C and D contradict the data, so I'd go with B.", "B"),
        ("It is not B, since B fails. So I choose (D).", "D"),
        ("Maybe it's B, but I cannot verify it.", None),
        ("It is not B.", None),
        ("The answer is B and C.", None),  # several options
        ("I computed 42 and it is large.", None),
    ],
)
def test_option_in_prose(response, expected):
    assert option_in_prose(response) == expected


def test_an_option_in_prose_counts_only_for_a_letter_gold(grader):
    response = "Option A fails and C is too large. I think it's B."
    assert grader.grade(response, "B")
    assert not grader.grade(response, "2")  # a value gold: no letter is read as its answer
