"""Pure-Python answer equivalence: normalization, exact numbers, and structured answers.

`envs.grading` compares two extracted answers in three steps; the first two live here and need
no sympy: normalize both as LaTeX text (`envs.grading.normalize.normalize_answer`), then parse them into a
light structure (`envs.grading.structure.parse_structure`) and compare item by item
(`envs.grading.structure.compare_structures`) with scalar/relation comparators. The comparators here
(`fast_scalar_eq`, `fast_relation_eq`) decide plain numbers exactly (`fractions.Fraction`) and
raise `NeedSymbolic` when algebra is needed; `envs/grading/_symbolic.py` supplies sympy comparators for the
same structure walk, inside the grading worker process.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from envs.grading.commutative import same_up_to_order
from envs.grading.forms import base_numerals_equal, clock_seconds, words_number
from envs.grading.latex_expr import numerically_different
from envs.grading.normalize import _match_brace, _squash, normalize_answer
from envs.grading.numbers import Num, numbers_equal, parse_number
from envs.grading.structure import (
    _CLOSE,
    _FLIP,
    _OPEN,
    NeedSymbolic,
    RelationEq,
    ScalarEq,
    Undecided,
    compare_structures,
    parse_structure,
    solution_pair,
)

__all__ = [
    "NeedSymbolic",
    "Undecided",
    "_match_brace",
    "compare_normalized",
    "fast_relation_eq",
    "fast_scalar_eq",
    "normalize_answer",
    "parse_number",
    "parse_structure",
    "solution_count",
]

_CHOICE_RE = re.compile(r"^\(?([A-Ea-e])\)?$")
_CHOICE_PREFIX_RE = re.compile(r"^\(?([A-E])(?:\)|\.|:|\)\.)\s*\S")


def _compare_choice(pred: str, gold: str) -> bool | None:
    """An option letter against the same option written out: gold "C" vs "C. x = 42" / "(C) 42".
    None when neither side is a bare letter facing a lettered option."""
    for bare, full in ((gold, pred), (pred, gold)):
        b, f = _CHOICE_RE.match(bare.strip()), _CHOICE_PREFIX_RE.match(full.strip())
        if b and f:
            return b.group(1).upper() == f.group(1)
    return None


_PLAIN_WORDS_RE = re.compile(r"^[A-Za-z][A-Za-z\s'\-]*$")


def fast_scalar_eq(pred: str, gold: str, *, finer_decimals: bool = True) -> bool:
    """Scalar equivalence decidable without algebra; raises NeedSymbolic otherwise.
    finer_decimals: the decimal rule's switch (`envs.grading.numbers.numbers_equal`)."""
    a, b = _squash(pred), _squash(gold)
    if a == b:
        return True
    na, nb = parse_number(pred), parse_number(gold)
    if na is not None and nb is not None:
        return numbers_equal(na, nb, finer_decimals=finer_decimals)
    base = base_numerals_equal(pred, gold)
    if base is not None:  # "4210_7" vs "4210_{7}" / "4210"
        return base
    ta, tb = clock_seconds(pred), clock_seconds(gold)
    if ta is not None and tb is not None:  # "20:34" vs "08:34 P.M."
        return ta == tb
    ca, cb = _CHOICE_RE.match(a), _CHOICE_RE.match(b)
    if ca and cb:
        return ca.group(1).upper() == cb.group(1).upper() if len(a) > 1 or len(b) > 1 else a == b
    wa, wb = _PLAIN_WORDS_RE.match(pred.strip()), _PLAIN_WORDS_RE.match(gold.strip())
    word_a = words_number(pred) if wa else None
    word_b = words_number(gold) if wb else None
    if (word_a is not None or word_b is not None) and (word_a is not None or na) and (word_b is not None or nb):
        # "twenty-five" vs "25" (or vs "twenty five"): the integers the words name
        num_a = na if word_a is None else Num(Fraction(word_a), False, None)
        num_b = nb if word_b is None else Num(Fraction(word_b), False, None)
        return numbers_equal(num_a, num_b, finer_decimals=finer_decimals)
    if wa and wb and (len(a) > 2 or len(b) > 2):  # words ("Evelyn", "odd"), not products like "xy"
        return a.lower() == b.lower()
    if (wa and len(a) > 2 and nb is not None) or (wb and len(b) > 2 and na is not None):
        return False
    if not a or not b:
        return False
    if same_up_to_order(pred, gold):  # "\\sum_{k} a_k b_{n-k}" vs "\\sum_{k} b_{n-k} a_k"
        return True
    if numerically_different(pred, gold):  # values that differ: not equal, without the worker
        return False
    raise NeedSymbolic(f"{pred!r} vs {gold!r}")


def fast_relation_eq(pp: list, po: list, gp: list, go: list) -> bool:
    """Two relations: equal when same text, or same lhs and op with equivalent rhs."""
    if po == go and _squash(pp[0]) == _squash(gp[0]):
        return fast_scalar_eq(pp[1], gp[1])
    if po == [_FLIP[o] for o in go] and _squash(pp[0]) == _squash(gp[1]) and _squash(pp[1]) == _squash(gp[0]):
        return True
    raise NeedSymbolic("relation")


MAX_STRUCT_CHARS = 1000  # longest eval gold is 210 chars; longer answers compare as strings only
MAX_DEPTH = 12  # bracket nesting beyond this compares as strings only


def _depth(s: str) -> int:
    depth = best = 0
    for c in s:
        if c in _OPEN:
            depth += 1
            best = max(best, depth)
        elif c in _CLOSE:
            depth -= 1
    return best


def compare_normalized(
    pred: str,
    gold: str,
    scalar_eq: ScalarEq,
    relation_eq: RelationEq,
    sets_eq: Callable[[tuple, tuple], bool] | None = None,
) -> bool:
    """Full comparison of two normalized answers with the given scalar/relation comparators.
    sets_eq: compares two conditions on one variable by their solution sets (`solution_pair`);
    without it (the fast stage) such a pair raises NeedSymbolic."""
    if _squash(pred) == _squash(gold):
        return True
    choice = _compare_choice(pred, gold)
    if choice is not None:
        return choice
    if max(len(pred), len(gold)) > MAX_STRUCT_CHARS or max(_depth(pred), _depth(gold)) > MAX_DEPTH:
        return False  # no real answer is this long or deep: spare the structure walk
    undecided: Undecided | None = None
    try:
        p, g = parse_structure(pred), parse_structure(gold)
        if compare_structures(p, g, scalar_eq, relation_eq):
            return True
    except RecursionError:
        return False
    except Undecided as e:
        undecided = e
    if solution_pair(p, g):  # "x^2 = 4" vs "x = 2 or x = -2"
        if sets_eq is None:
            raise NeedSymbolic("solution sets")
        if sets_eq(p, g):
            return True
    # Decimal comma ("1000,99" for 1000.99) when the other side is a decimal number.
    a, b = _squash(pred), _squash(gold)
    if (
        re.fullmatch(r"-?\d+,\d+", a)
        and re.fullmatch(r"-?\d*\.\d+", b)
        or re.fullmatch(r"-?\d+,\d+", b)
        and re.fullmatch(r"-?\d*\.\d+", a)
    ):
        na, nb = parse_number(a.replace(",", ".")), parse_number(b.replace(",", "."))
        if na is not None and nb is not None:
            return numbers_equal(na, nb)
    if undecided is not None:
        raise undecided
    return False


_SEVERAL_RE = re.compile(r"[,;±]|\\pm|\\mp|\band\b|\bor\b|\\cup")


def solution_count(gold: str) -> int:
    """How many solutions a gold lists when it is a set or a list of values ("\\{2, 5\\}", "1, 4",
    "\\pm 7"); 0 for anything else (a tuple is one answer, its order matters)."""
    if len(gold) > MAX_STRUCT_CHARS or not _SEVERAL_RE.search(gold):
        return 0  # (the common case: one value, decided without parsing)
    try:
        node = parse_structure(normalize_answer(gold))
    except RecursionError:
        return 0
    return len(node[1]) if node[0] in ("set", "list") else 0
