"""Formulas equal up to the order of commuting factors and terms (no sympy): `same_up_to_order`.

"a_k b_{n-k}" and "b_{n-k} a_k" are one product; so are "\\sum_{k=0}^{n} a_k b_{n-k}" and
"\\sum_{k=0}^{n} b_{n-k} a_k", and "xy + 2z" and "2z + yx". Our sympy translator reads the first
and the last, but not a sum with its bounds, so the fast stage reads the order itself: each side
is split into terms (at + and - outside brackets) and each term into factors, and two sides are
equal when they have the same terms with the same factors, in any order. Only what surely
commutes is reordered: lowercase letters and Greek letters with their subscripts and exponents,
a leading number, and parenthesized groups (themselves compared the same way). Anything else
(a capital letter, which may name a matrix, unless a lowercase index makes it a term of a
sequence, F_k or F_{n-k-1}; a function such as \\sin, whose argument is the factor after it; a
fraction) leaves the pair to the other stages. A sum or product sign
(`\\sum_{k=0}^{n}`, `\\prod_{i=1}^{m}`) may open a single term; its bounds are compared as text.
This rule only ever says "equal": a pair it cannot read is decided elsewhere.
"""

from __future__ import annotations

import re

__all__ = ["same_up_to_order"]

_GREEK = (
    "alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|"
    "rho|sigma|tau|upsilon|phi|varphi|chi|psi|omega"
)
_SCRIPT = r"(?:\{[^{}]*\}|[a-zA-Z0-9])"
_ATOM_RE = re.compile(
    rf"(?:[a-z]|\\(?:{_GREEK})(?![a-zA-Z]))(?:[_^]{_SCRIPT}){{0,2}}'*"
    rf"|[A-Z]_(?:\{{[^{{}}]*[a-z][^{{}}]*\}}|[a-z])(?:\^{_SCRIPT})?'*"  # a term of a sequence: F_k, F_{{n-k-1}}
)
_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")
_OPERATOR_RE = re.compile(rf"\\(?:sum|prod)(?![a-zA-Z])(?:[_^]{_SCRIPT}){{0,2}}")
_TIMES_RE = re.compile(r"\\(?:cdot|times)(?![a-zA-Z])|\*")


def _group_end(s: str, i: int) -> int:
    """Index after the ')' closing the '(' at s[i], or -1."""
    depth = 0
    for j in range(i, len(s)):
        depth += s[j] == "("
        depth -= s[j] == ")"
        if depth == 0:
            return j + 1
    return -1


def _terms(s: str) -> list[str] | None:
    """Signed terms at the top level ("a - bc" -> ["+a", "-bc"])."""
    terms, depth, start, sign = [], 0, 0, "+"
    s = s.strip()
    if s[:1] in "+-":
        sign, s = s[0], s[1:]
    for i, c in enumerate(s):
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c in "+-" and depth == 0 and i > 0 and s[i - 1] not in "_^":
            terms.append(sign + s[start:i])
            sign, start = c, i + 1
    terms.append(sign + s[start:])
    return None if depth != 0 or any(not t[1:].strip() for t in terms) else terms


def _factors(term: str) -> list[str] | None:
    """The factors of one product, canonical; None when a part may not commute."""
    out, i, s = [], 0, term.strip()
    while i < len(s):
        if s[i] in " \t":
            i += 1
            continue
        m = _TIMES_RE.match(s, i)
        if m:
            i = m.end()
            continue
        if s[i] == "(":
            end = _group_end(s, i)
            inner = canonical(s[i + 1 : end - 1]) if end > 0 else None
            if inner is None:
                return None
            out.append(f"({inner})")
            i = end
            continue
        m = _NUMBER_RE.match(s, i)
        if m and not out:
            out.append(m.group(0))
            i = m.end()
            continue
        m = _ATOM_RE.match(s, i)
        if not m:
            return None
        out.append(re.sub(r"\s+", "", m.group(0)))
        i = m.end()
    return out or None


def canonical(s: str) -> str | None:
    """The sorted-terms, sorted-factors form of a formula, or None when it is not one we reorder."""
    terms = _terms(s)
    if terms is None:
        return None
    canon = []
    for t in terms:
        sign, body = t[0], t[1:].strip()
        op = _OPERATOR_RE.match(body)
        prefix = ""
        if op:
            if len(terms) > 1:
                return None  # where a sum's body ends is a reading: "\sum a_k + b" is not reordered
            prefix, body = re.sub(r"\s+", "", op.group(0)), body[op.end() :]
        factors = _factors(body)
        if factors is None:
            return None
        canon.append(sign + prefix + "·".join(sorted(factors)))  # (a separator: "a_1·b" is not "a_{1b}")
    return "".join(sorted(canon))


def same_up_to_order(pred: str, gold: str) -> bool:
    """True when two normalized formulas differ only in the order of commuting factors/terms."""
    if len(pred) > 300 or len(gold) > 300:
        return False
    a, b = canonical(pred), canonical(gold)
    return a is not None and a == b
