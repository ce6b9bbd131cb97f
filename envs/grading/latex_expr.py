"""LaTeX answers as Python expression text (no sympy): `to_python`, and a float evaluation that
only ever rejects, `numerically_different`.

`to_python` translates a normalized LaTeX scalar ("\\frac{1}{2}x^2 + \\sin\\theta", "a_{n+1}",
"factorial(n)") into expression text over a whitelist of names (every identifier is checked;
nothing else can be named), with implicit products left to the reader: sympy's parser reads it in
the grading worker (`envs.grading._symbolic`). Here, in this process, the same text is evaluated
with complex floats at a few random points, all numbers as floats (so no power or factorial can
grow without bound): two expressions whose values clearly differ at some point are not equal,
which decides most wrong algebraic answers without the worker. Agreeing values prove nothing and
decide nothing: equality is only ever proved exactly, by the worker.
"""

from __future__ import annotations

import cmath
import io
import math
import random
import re
import tokenize

from envs.grading.normalize import _match_brace

__all__ = ["GREEK_IDENT", "Unsupported", "numerically_different", "to_python"]

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
GREEK_IDENT = {g: f"g_{g}" for g in _GREEK}  # "lambda" is a Python keyword: never emit it raw
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


class Unsupported(Exception):
    """A LaTeX construct the translator does not read."""


def _arg(s: str, i: int) -> tuple[str, int]:
    """One macro argument at s[i:]: a {group}, a \\command, or a single character."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise Unsupported("missing argument")
    if s[i] == "{":
        k = _match_brace(s, i)
        if k < 0:
            raise Unsupported("unbalanced")
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
        raise Unsupported("unbalanced")
    if i < len(s) and s[i] == "{":
        return _arg(s, i)
    if s.startswith("\\", i):  # \sin\theta, \sin\frac{\pi}{3}: one command with its arguments
        m = re.match(r"\\([a-zA-Z]+)", s[i:])
        if not m:
            raise Unsupported("function argument")
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
        raise Unsupported("missing function argument")
    return s[i:j], j


def to_python(s: str) -> str:
    """Translate normalized LaTeX into a Python/sympy expression string (or raise)."""
    if re.search(r"(?<![_^\w.])\d+\s+\d", s):  # "11 7/6": neither a product nor a mixed number we trust
        raise Unsupported("digits separated by a space")
    out: list[str] = []
    i, n, abs_open = 0, len(s), False
    while i < n:
        c = s[i]
        if c == "\\":
            m = re.match(r"\\([a-zA-Z]+)", s[i:])
            if not m:
                raise Unsupported(s[i : i + 2])
            name = m.group(1)
            i += m.end()
            if name == "frac":
                a, i = _arg(s, i)
                b, i = _arg(s, i)
                out.append(f"(({to_python(a)})/({to_python(b)}))")
            elif name == "sqrt":
                if i < n and s[i] == "[":
                    k = s.index("]", i)
                    idx, i = s[i + 1 : k], k + 1
                    a, i = _arg(s, i)
                    out.append(f"root({to_python(a)},{to_python(idx)})")
                else:
                    a, i = _arg(s, i)
                    out.append(f"sqrt({to_python(a)})")
            elif name == "binom":
                a, i = _arg(s, i)
                b, i = _arg(s, i)
                out.append(f"binomial({to_python(a)},{to_python(b)})")
            elif name in _FUNCS:
                base = power = None
                if name == "log" and s[i : i + 1] == "_":
                    base, i = _arg(s, i + 1)
                if s[i : i + 1] == "^":
                    power, i = _arg(s, i + 1)
                arg, i = _func_arg(s, i)
                expr = f"{_FUNCS[name]}({to_python(arg)})"
                if base is not None:
                    expr = f"log({to_python(arg)},{to_python(base)})"
                if power is not None:
                    expr = f"(({expr})**({to_python(power)}))"
                out.append(f" {expr} ")
            elif name in GREEK_IDENT:
                out.append(f" {GREEK_IDENT[name]} ")
            elif name == "pi":
                out.append(" pi ")
            elif name == "infty":
                out.append(" oo ")
            elif name in ("cdot", "times", "ast"):
                out.append("*")
            elif name == "div":
                out.append("/")
            else:
                raise Unsupported(name)
        elif c == "{":
            k = _match_brace(s, i)
            if k < 0:
                raise Unsupported("unbalanced")
            out.append(f"({to_python(s[i + 1 : k])})")
            i = k + 1
        elif c == "^":
            a, i = _arg(s, i + 1)
            out.append(f"**({to_python(a)})")
        elif c == "_":
            a, i = _arg(s, i + 1)
            # Operators stay in the name: a_{n+1} and a_{n-1} are two different symbols.
            sub = re.sub(r"[^A-Za-z0-9]", lambda m: _SUBSCRIPT_SIGNS.get(m.group(0), ""), a)
            if not sub or not out or not re.search(r"[A-Za-z]$", out[-1]):
                raise Unsupported("subscript")
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
            elif run in GREEK_IDENT:
                out.append(f" {GREEK_IDENT[run]} ")
            else:  # "xy" is x*y
                out.append(" " + "*".join(run))
        elif c.isdigit() or c == ".":
            # A decimal literal becomes its exact rational (10.5 -> 105/10): decimals are judged
            # by the decimal rule on whole numbers, never by a float tolerance inside algebra.
            m = re.match(r"\d*\.?\d*", s[i:])
            lit = m.group(0)
            i += max(len(lit), 1)
            if lit == ".":
                raise Unsupported("lone dot")
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
            raise Unsupported(c)
    if abs_open:
        raise Unsupported("unbalanced |")
    py = "".join(out)
    for ident in _IDENT_RE.findall(py):
        if ident not in _EXTRA_OK and not _SAFE_IDENT_RE.match(ident):
            raise Unsupported(ident)
    if "__" in py or len(py) > 2000:
        raise Unsupported("unsafe")
    return py


# ----------------------------------------------------------------------------- float rejection

_CONSTANTS = {"e": math.e, "i": 1j, "pi": math.pi}


def _real_only(fn):
    def call(*args):
        if any(abs(complex(a).imag) > 1e-12 for a in args):
            raise ValueError("complex argument")
        return fn(*(complex(a).real for a in args))

    return call


_FLOAT_FUNCS = {
    "sin": cmath.sin,
    "cos": cmath.cos,
    "tan": cmath.tan,
    "cot": lambda x: 1 / cmath.tan(x),
    "sec": lambda x: 1 / cmath.cos(x),
    "csc": lambda x: 1 / cmath.sin(x),
    "asin": cmath.asin,
    "acos": cmath.acos,
    "atan": cmath.atan,
    "sinh": cmath.sinh,
    "cosh": cmath.cosh,
    "tanh": cmath.tanh,
    "exp": cmath.exp,
    "sqrt": cmath.sqrt,
    "log": lambda x, b=None: cmath.log(x) if b is None else cmath.log(x) / cmath.log(b),
    "Abs": abs,
    "root": lambda x, n: x ** (1 / n),
    "factorial": _real_only(lambda x: math.gamma(x + 1)),
    "binomial": _real_only(lambda n, k: math.gamma(n + 1) / (math.gamma(k + 1) * math.gamma(n - k + 1))),
}
_OPENERS = {tokenize.NUMBER, tokenize.NAME}


def _float_program(py: str) -> tuple[str, set[str]] | None:
    """The expression with explicit products and float literals, and its free names; None when
    it holds what a float evaluation should not meet (factorial notation, infinity)."""
    if "!" in py or "oo" in re.findall(r"[A-Za-z_]\w*", py):
        return None
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(py).readline) if t.string.strip()]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    out: list[str] = []
    names: set[str] = set()
    prev = None
    for tok in tokens:
        kind, text = tok.type, tok.string
        starts_operand = kind in _OPENERS or text == "("
        if prev is not None and starts_operand:
            prev_kind, prev_text = prev
            ends_operand = (
                prev_kind == tokenize.NUMBER
                or prev_text == ")"
                or (prev_kind == tokenize.NAME and prev_text not in _FLOAT_FUNCS)
            )
            if ends_operand:
                out.append("*")  # "2 x", "x (y)", ") (": implicit products
        if kind == tokenize.NUMBER:
            text = repr(float(text))
        elif kind == tokenize.NAME and text not in _FLOAT_FUNCS and text not in _CONSTANTS:
            names.add(text)
        out.append(text)
        prev = (kind, text)
    return "".join(out), names


_POINTS = 3
_REL_TOL = 1e-6  # far above float rounding, far below any difference of two different answers


def _value(program: str, env: dict) -> complex | None:
    try:
        v = complex(eval(program, {"__builtins__": {}}, env))  # noqa: S307 (whitelisted names only)
    except (ArithmeticError, ValueError, TypeError, RecursionError, MemoryError, SyntaxError, NameError):
        return None
    return v if cmath.isfinite(v) else None


def numerically_different(pred: str, gold: str) -> bool:
    """True when the two normalized scalars both translate and their values clearly differ at
    some random point with both signs (never True for two equal expressions: their values agree
    to float rounding); False when undecided."""
    if len(pred) + len(gold) > 600:
        return False
    try:
        a, b = _float_program(to_python(pred)), _float_program(to_python(gold))
    except (Unsupported, ValueError, IndexError, RecursionError):
        return False
    if a is None or b is None:
        return False
    names = sorted(a[1] | b[1])
    rng = random.Random(4321)  # the same pair always gets the same verdict
    for j in range(_POINTS):
        env = dict(_FLOAT_FUNCS) | _CONSTANTS
        for n, name in enumerate(names):
            env[name] = (-1) ** (j + n) * rng.uniform(0.3, 2.7)
        va, vb = _value(a[0], env), _value(b[0], env)
        if va is not None and vb is not None and abs(va - vb) > _REL_TOL * max(1.0, abs(va), abs(vb)):
            return True
    return False
