"""Symbolic answer comparison with sympy: runs in the grading worker process only.

`envs.grading` sends (pred, gold) pairs that plain numbers cannot decide to its worker process
(`python -m envs.grading._worker`), one JSON line each, and kills that process if it overruns its
time bound. Here the answers are converted from LaTeX to sympy by a small translator of our own (no
eval of model text: every identifier of the translated text is checked against a whitelist and
builtins are removed from the evaluation namespace), then compared exactly (`envs.grading._exact`):

- decimal literals inside an expression become exact rationals (10.5 -> 21/2); a scalar that is
  a written decimal against an exact expression follows the decimal rule of `envs.grading.numbers`
  (`decimal_matches_exact`), never a tolerance;
- numbers and expressions: equal only with a proof that the difference is zero (`envs.grading._exact`:
  numerical evaluation only rejects);
- relations: `a = b` vs `c = d` when a - b and c - d are proportional; inequalities when they are
  positively proportional with the same strictness;
- conditions on one real variable (`x^2 = 4` vs `x = 2 or x = -2`, `|x| < 2` vs
  `-2 < x and x < 2`): their solution sets over the reals (`envs.grading._solution_sets`).

A side our translator cannot read leaves the pair undecided (`Undecided`); the worker then asks
the math-verify stage (`envs/grading/_mv_stage.py`), whose "equal" is re-checked exactly before it counts.
"""

from __future__ import annotations

import re
from functools import partial

import sympy
from sympy.parsing.sympy_parser import (
    implicit_multiplication,
    parse_expr,
    standard_transformations,
)

from envs.grading._exact import decimal_vs_expr, exprs_equal, proportional
from envs.grading._solution_sets import solution_sets_equal
from envs.grading.equivalence import (
    NeedSymbolic,
    Undecided,
    _match_brace,
    compare_normalized,
    fast_relation_eq,
    fast_scalar_eq,
)
from envs.grading.numbers import parse_number

_FUNCS = {
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "cot": "cot",
    "sec": "sec",
    "csc": "csc",
    "arcsin": "asin",
    "arccos": "acos",
    "arctan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "tanh": "tanh",
    "ln": "log",
    "log": "log",
    "exp": "exp",
    "sqrt": "sqrt",
    "abs": "Abs",
}
# Function names as sympy prints them ("factorial(n)/factorial(n+1)", "Abs(x)"), read where an
# answer is written in sympy's syntax rather than LaTeX.
_SYMPY_FUNCS = {"factorial", "binomial", "Abs", "asin", "acos", "atan"}
# Subscript characters that are not letters or digits, spelled out inside the symbol's name.
_SUBSCRIPT_SIGNS = {"+": "Qp", "-": "Qm", ",": "Qc", "*": "Qt", "/": "Qd", "^": "Qe", "(": "Qo", ")": "Qx", "'": "Qi"}
_GREEK = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
    "Gamma",
    "Delta",
    "Theta",
    "Lambda",
    "Xi",
    "Sigma",
    "Upsilon",
    "Phi",
    "Psi",
    "Omega",
]
_GREEK_IDENT = {g: f"g_{g}" for g in _GREEK}  # "lambda" is a Python keyword: never emit it raw
_EXTRA_OK = {
    "sqrt",
    "root",
    "Abs",
    "binomial",
    "factorial",
    "pi",
    "oo",
    "asin",
    "acos",
    "atan",
    "sin",
    "cos",
    "tan",
    "cot",
    "sec",
    "csc",
    "sinh",
    "cosh",
    "tanh",
    "log",
    "exp",
}
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SAFE_IDENT_RE = re.compile(r"^(?:[A-Za-z](?:_[A-Za-z0-9]+)?|g_[A-Za-z]+)$")

_LOCALS: dict = {c: sympy.Symbol(c) for c in "abcdfghjklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"}
_LOCALS.update({"e": sympy.E, "i": sympy.I, "pi": sympy.pi, "oo": sympy.oo})
_LOCALS.update({ident: sympy.Symbol(g) for g, ident in _GREEK_IDENT.items()})
_GLOBALS: dict = {}
exec("from sympy import *", _GLOBALS)  # the names parse_expr's transformations emit
_GLOBALS["__builtins__"] = {}  # model text can never reach open/exec/__import__
_TRANSFORMS = standard_transformations + (implicit_multiplication,)


class _Unsupported(Exception):
    pass


def _arg(s: str, i: int) -> tuple[str, int]:
    """One macro argument at s[i:]: a {group}, a \\command, or a single character."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise _Unsupported("missing argument")
    if s[i] == "{":
        k = _match_brace(s, i)
        if k < 0:
            raise _Unsupported("unbalanced")
        return s[i + 1 : k], k + 1
    if s[i] == "\\":
        m = re.match(r"\\[a-zA-Z]+", s[i:])
        if m:
            return m.group(0), i + m.end()
    return s[i], i + 1


# A command that ends a function's argument ("\sin x\cos x"); a letter command does not
# ("\cos 2\theta" is cos(2 theta)).
_FUNCTION_NEXT_RE = re.compile(r"\\(?:" + "|".join(_FUNCS) + r"|cdot|times|div)(?![a-zA-Z])")


def _func_arg(s: str, i: int) -> tuple[str, int]:
    """The argument of \\sin etc.: a (group), a {group}, or the next term up to an operator."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i < len(s) and s[i] == "(":
        depth = 0
        for j in range(i, len(s)):
            depth += s[j] == "("
            depth -= s[j] == ")"
            if depth == 0:
                return s[i + 1 : j], j + 1
        raise _Unsupported("unbalanced")
    if i < len(s) and s[i] == "{":
        return _arg(s, i)
    if s.startswith("\\", i):  # \sin\theta, \sin\frac{\pi}{3}: one command with its arguments
        m = re.match(r"\\([a-zA-Z]+)", s[i:])
        if not m:
            raise _Unsupported("function argument")
        j = i + m.end()
        for _ in range({"frac": 2, "dfrac": 2, "binom": 2, "sqrt": 1}.get(m.group(1), 0)):
            _, j = _arg(s, j)
        return s[i:j], j
    depth, j = 0, i
    while j < len(s):
        c = s[j]
        if c in "{(":
            depth += 1
        elif c in "})":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and (c in " +-=," or _FUNCTION_NEXT_RE.match(s, j)):  # "2\sin x\cos x": x, then \cos
            break
        j += 1
    if j == i:
        raise _Unsupported("missing function argument")
    return s[i:j], j


def _to_py(s: str) -> str:
    """Translate normalized LaTeX into a Python/sympy expression string (or raise)."""
    if re.search(r"(?<![_^\w.])\d+\s+\d", s):  # "11 7/6": neither a product nor a mixed number we trust
        raise _Unsupported("digits separated by a space")
    out: list[str] = []
    i, n, abs_open = 0, len(s), False
    while i < n:
        c = s[i]
        if c == "\\":
            m = re.match(r"\\([a-zA-Z]+)", s[i:])
            if not m:
                raise _Unsupported(s[i : i + 2])
            name = m.group(1)
            i += m.end()
            if name == "frac":
                a, i = _arg(s, i)
                b, i = _arg(s, i)
                out.append(f"(({_to_py(a)})/({_to_py(b)}))")
            elif name == "sqrt":
                if i < n and s[i] == "[":
                    k = s.index("]", i)
                    idx, i = s[i + 1 : k], k + 1
                    a, i = _arg(s, i)
                    out.append(f"root({_to_py(a)},{_to_py(idx)})")
                else:
                    a, i = _arg(s, i)
                    out.append(f"sqrt({_to_py(a)})")
            elif name == "binom":
                a, i = _arg(s, i)
                b, i = _arg(s, i)
                out.append(f"binomial({_to_py(a)},{_to_py(b)})")
            elif name in _FUNCS:
                base = power = None
                if name == "log" and s[i : i + 1] == "_":
                    base, i = _arg(s, i + 1)
                if s[i : i + 1] == "^":
                    power, i = _arg(s, i + 1)
                arg, i = _func_arg(s, i)
                expr = f"{_FUNCS[name]}({_to_py(arg)})"
                if base is not None:
                    expr = f"log({_to_py(arg)},{_to_py(base)})"
                if power is not None:
                    expr = f"(({expr})**({_to_py(power)}))"
                out.append(f" {expr} ")
            elif name in _GREEK_IDENT:
                out.append(f" {_GREEK_IDENT[name]} ")
            elif name == "pi":
                out.append(" pi ")
            elif name == "infty":
                out.append(" oo ")
            elif name in ("cdot", "times", "ast"):
                out.append("*")
            elif name == "div":
                out.append("/")
            else:
                raise _Unsupported(name)
        elif c == "{":
            k = _match_brace(s, i)
            if k < 0:
                raise _Unsupported("unbalanced")
            out.append(f"({_to_py(s[i + 1 : k])})")
            i = k + 1
        elif c == "^":
            a, i = _arg(s, i + 1)
            out.append(f"**({_to_py(a)})")
        elif c == "_":
            a, i = _arg(s, i + 1)
            # Operators stay in the name: a_{n+1} and a_{n-1} are two different symbols.
            sub = re.sub(r"[^A-Za-z0-9]", lambda m: _SUBSCRIPT_SIGNS.get(m.group(0), ""), a)
            if not sub or not out or not re.search(r"[A-Za-z]$", out[-1]):
                raise _Unsupported("subscript")
            out[-1] = out[-1] + "_" + sub
        elif c == "|":
            out.append(")" if abs_open else "Abs(")
            abs_open = not abs_open
            i += 1
        elif c.isascii() and c.isalpha():
            m = re.match(r"[A-Za-z]+", s[i:])
            run = m.group(0)
            i += len(run)
            if run in _FUNCS and s[i : i + 1] == "(":
                out.append(f" {_FUNCS[run]}")
            elif run in _SYMPY_FUNCS and s[i : i + 1] == "(":  # sympy's own spelling: factorial(n)
                out.append(f" {run}")
            elif run == "pi":
                out.append(" pi ")
            elif run in _GREEK_IDENT:
                out.append(f" {_GREEK_IDENT[run]} ")
            else:  # "xy" is x*y
                out.append(" " + "*".join(run))
        elif c.isdigit() or c == ".":
            # A decimal literal becomes its exact rational (10.5 -> 105/10): decimals are judged
            # by the decimal rule on whole numbers, never by a float tolerance inside algebra.
            m = re.match(r"\d*\.?\d*", s[i:])
            lit = m.group(0)
            i += max(len(lit), 1)
            if lit == ".":
                raise _Unsupported("lone dot")
            if "." in lit:
                whole, frac = lit.split(".")
                out.append(
                    f"({int(whole or '0') * 10 ** len(frac) + int(frac or '0')}/1{'0' * len(frac)})"
                    if frac
                    else str(int(whole))
                )
            else:
                out.append(lit)
        elif c in "+-*/(), !":
            out.append(c)
            i += 1
        elif c in "[]":
            out.append("(" if c == "[" else ")")
            i += 1
        else:
            raise _Unsupported(c)
    if abs_open:
        raise _Unsupported("unbalanced |")
    py = "".join(out)
    for ident in _IDENT_RE.findall(py):
        if ident not in _EXTRA_OK and not _SAFE_IDENT_RE.match(ident):
            raise _Unsupported(ident)
    if "__" in py or len(py) > 2000:
        raise _Unsupported("unsafe")
    return py


def latex_to_sympy(s: str):
    """sympy expression for a normalized LaTeX scalar, or None when it cannot be translated."""
    try:
        py = _to_py(s.strip())
        if not py.strip():
            return None
        raw = parse_expr(
            py, local_dict=dict(_LOCALS), global_dict=_GLOBALS, transformations=_TRANSFORMS, evaluate=False
        )
        if not isinstance(raw, sympy.Basic) or _too_big(raw):
            return None
        return parse_expr(
            py, local_dict=dict(_LOCALS), global_dict=_GLOBALS, transformations=_TRANSFORMS, evaluate=True
        )
    except Exception:
        return None


def _too_big(expr) -> bool:
    """Powers/factorials whose exact evaluation would take seconds (2^{10^{10}}, 10000!)."""
    for node in sympy.preorder_traversal(expr):
        try:
            if isinstance(node, sympy.Pow) and node.base.is_number and node.exp.is_number:
                if abs(float(node.exp)) > 1e4 and abs(float(node.base)) != 1:
                    return True
            if isinstance(node, sympy.factorial) and node.args[0].is_number:
                if abs(float(node.args[0])) > 1e4:
                    return True
        except (TypeError, ValueError, OverflowError):
            return True
    return False


def sympy_scalar_eq(pred: str, gold: str, *, finer_decimals: bool = True) -> bool:
    try:
        return fast_scalar_eq(pred, gold, finer_decimals=finer_decimals)
    except NeedSymbolic:
        pass
    a, b = latex_to_sympy(pred), latex_to_sympy(gold)
    if a is None or b is None:
        raise Undecided(f"cannot translate {pred if a is None else gold!r}")
    for text, other in ((pred, b), (gold, a)):
        num = parse_number(text)
        if num is not None and num.approx:  # a written decimal: judged by the decimal rule
            return decimal_vs_expr(num, other)
    return exprs_equal(a, b)


def sympy_relation_eq(pp: list, po: list, gp: list, go: list) -> bool:
    try:
        return fast_relation_eq(pp, po, gp, go)
    except NeedSymbolic:
        pass
    if len(po) != 1 or len(go) != 1:
        return False
    sides = [latex_to_sympy(x) for x in (pp[0], pp[1], gp[0], gp[1])]
    if any(x is None for x in sides):
        return False
    e1, e2 = sides[0] - sides[1], sides[2] - sides[3]
    op1, op2 = po[0], go[0]
    if "=" in (op1, op2) or "!=" in (op1, op2):
        return op1 == op2 and proportional(e1, e2, positive=False)
    if (op1 in ("<", ">")) != (op2 in ("<", ">")):
        return False
    e1 = -e1 if op1 in ("<", "<=") else e1  # both now read "e > 0" / "e >= 0"
    e2 = -e2 if op2 in ("<", "<=") else e2
    return proportional(e1, e2, positive=True)


def symbolic_equivalent(pred: str, gold: str, *, finer_decimals: bool = True) -> bool | None:
    """Full comparison of two normalized answers with sympy scalars, relations and solution
    sets; None when our translator could not read some part (math-verify may still decide)."""
    scalar_eq = partial(sympy_scalar_eq, finer_decimals=finer_decimals)
    try:
        return compare_normalized(
            pred, gold, scalar_eq, sympy_relation_eq, partial(solution_sets_equal, to_sympy=latex_to_sympy)
        )
    except Undecided:
        return None
    except NeedSymbolic:
        return False
