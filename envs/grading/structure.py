"""The structure of an answer and its comparison item by item (no sympy).

`parse_structure` reads a normalized answer as nested tuples (scalar, tuple/interval, set, list,
union, matrix, relation); `compare_structures` walks two of them with scalar and relation
comparators supplied by the caller: the exact fast ones of `envs.grading.equivalence`, or the sympy ones of
`envs.grading._symbolic` inside the grading worker. A comparator raises `NeedSymbolic` when it cannot
decide a part.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from envs.grading.forms import FUNCTION_HEAD_RE
from envs.grading.normalize import _squash, normalize_answer
from envs.grading.numbers import parse_number


class NeedSymbolic(Exception):
    """A scalar (or relation) comparison that plain numbers and strings cannot decide."""


class Undecided(NeedSymbolic):
    """Our parsers cannot read a side (a translator failure, an expression of matrices, kinds our
    structure does not pair): the worker's math-verify stage may still decide, guarded."""


_OPEN, _CLOSE = "([{", ")]}"
_REL_SPLIT_RE = re.compile(r"(<=|>=|!=|=|<|>|\\approx)")


def _split_top(s: str, seps: re.Pattern, found: list[str] | None = None) -> list[str]:
    """Split s at separator matches that are outside all brackets (appended to `found`)."""
    parts, depth, last, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif depth == 0:
            m = seps.match(s, i)
            if m and m.end() > i:
                if found is not None:
                    found.append(m.group(0).strip())
                parts.append(s[last:i])
                last = i = m.end()
                continue
        i += 1
    parts.append(s[last:])
    return parts


def _wrapped(s: str) -> bool:
    """True when the bracket at s[0] closes exactly at s[-1] (any bracket types: intervals)."""
    depth = 0
    for i, c in enumerate(s):
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth == 0 and i != len(s) - 1:
                return False
    return depth == 0


# Separators start where a run of spaces starts (`_split_top` tries them at every position).
_LIST_SEP = re.compile(r"(?<!\s)\s*(?:,|;|\band\b|\bor\b)\s*")
_COMMA = re.compile(r"(?<!\s)\s*,\s*")
_SEMI = re.compile(r"(?<!\s)\s*;\s*")
_CUP = re.compile(r"(?<!\s)\s*\\cup\s*")
_MATRIX_RE = re.compile(r"^\\begin\{([pbvBV]?matrix|smallmatrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}$", re.DOTALL)
# A label on the left of "=": a name (x, x_1, AB, \\alpha, f(x)), a ratio of names (V_1:V_2), a
# quotient of names (\\frac{NO}{BO}), |AB|, \\angle ABC, or a tuple of names ((p,q,r)). Never
# an expression with operators or digits outside subscripts ("a+3z = 0", "7 = 11a+c").
# Written so that a text has one way to match at most (model text reaches it: a run of letters
# matched as "names of names" backtracked exponentially): a name is one letter or one command (a
# run of letters is several names), its subscript braced or a digit run or one letter then digits.
_NAME = r"(?:[a-zA-Z]|\\(?!frac|sqrt|binom)[a-zA-Z]+(?![a-zA-Z]))(?:_(?:\{[a-zA-Z0-9,]+\}|[0-9]+|[a-zA-Z][0-9]*)(?![0-9]))?'*"
_NAMES = rf"{_NAME}(?:\s*{_NAME})*"
_VAR_LHS_RE = re.compile(
    rf"^(?:{_NAMES}|\\angle\s*{_NAMES}|(?:[a-zA-Z]+|\\(?!frac|sqrt|binom)[a-zA-Z]+)(?:_[a-zA-Z0-9]+|_\{{[a-zA-Z0-9,]+\}})?'*\([a-zA-Z0-9, ]*\)|"
    rf"\\frac\{{{_NAMES}\}}\{{{_NAMES}\}}|{_NAMES}\s*:\s*{_NAMES}|\|{_NAMES}\||\([a-zA-Z](?:\s*,\s*[a-zA-Z])*\))$"
)
MAX_LABEL_CHARS = 80  # a label longer than this is prose, not a name


def is_label(text: str) -> bool:
    """A name, a ratio, a quotient of names, ... (`_VAR_LHS_RE`): the left side of an assignment."""
    return len(text) <= MAX_LABEL_CHARS and _VAR_LHS_RE.match(text) is not None


def parse_structure(s: str):
    """Parse a normalized answer into nested tuples:
    ("scalar", text) | ("seq", open, close, items) | ("set", items) |
    ("list", items, connective) | ("union", items) | ("matrix", rows) | ("rel", pieces, ops).
    A list's connective is "and" or "or" when every separator is that word, else ","."""
    s = s.strip()
    seps: list[str] = []
    items = [p for p in _split_top(s, _LIST_SEP, seps) if p.strip()]
    if len(items) > 1:  # "1, 2", "12 and 13", "x = 1 or x = 2"
        words = set(seps)
        return ("list", _items(items), words.pop() if words in ({"and"}, {"or"}) else ",")
    ops: list[str] = []
    pieces = [p.strip() for p in _split_top(s, _REL_SPLIT_RE, ops)]
    if ops:
        if "\\approx" in ops:  # "x \approx 3.1" -> 3.1 ; "1/3 \approx 0.33" -> 1/3
            k = ops.index("\\approx")
            exact = "".join(p + o for p, o in zip(pieces[:k], ops[:k])) + pieces[k]
            is_var = k == 0 and is_label(pieces[0])
            return parse_structure(pieces[k + 1] if is_var else exact)
        return ("rel", pieces, ops)
    if "\\cup" in s:
        parts = _split_top(s, _CUP)
        if len(parts) > 1:
            return ("union", [parse_structure(p) for p in parts])
    summed = _matrix_sum(s) if s.count("\\begin{") > 1 else None
    if summed is not None:  # "A + B" of written matrices: the matrix it evaluates to
        return summed
    m = _MATRIX_RE.match(s[1:-1].strip() if s[:1] in "([" and _wrapped(s) else s)
    if m:
        rows = [r for r in re.split(r"\\\\", m.group(2)) if r.strip() and "\\hline" not in r]
        return ("matrix", [[c.strip() for c in r.split("&")] for r in rows])
    if s in ("\\emptyset", "\\{\\}", "{}"):
        return ("set", [])
    if s.startswith("\\{") and s.endswith("\\}") and _wrapped(s[1:-2] + "}"):
        inner = s[2:-2]
        return ("set", _items(_item_texts(inner)) if inner.strip() else [])
    if len(s) >= 2 and s[0] == "{" and s[-1] == "}" and _wrapped(s):  # "{-2021, 2021}": braces, no backslash
        parts = _item_texts(s[1:-1])
        if len(parts) > 1:
            return ("set", _items(parts))
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _wrapped(s):
        parts = _item_texts(s[1:-1])
        if len(parts) > 1:
            return ("seq", s[0], s[-1], [parse_structure(p) for p in parts])
    pm = _split_top(s, re.compile(r"\\(?:pm|mp)(?![a-zA-Z])"))
    if len(pm) == 2:  # "1 \pm \sqrt{19}" -> {1+\sqrt{19}, 1-\sqrt{19}}
        a, b = pm[0].strip(), pm[1].strip()
        return ("set", [("scalar", f"{a}+{b}" if a else b), ("scalar", f"{a}-{b}" if a else f"-{b}")], "pm")
    return ("scalar", s)


_WRITTEN_MATRIX_RE = re.compile(r"\\begin\{([pbvBV]?matrix|smallmatrix)\}(.*?)\\end\{\1\}", re.DOTALL)


def _matrix_rows(body: str) -> list[list[str]]:
    rows = [r for r in re.split(r"\\\\", body) if r.strip() and "\\hline" not in r]
    return [[c.strip() for c in r.split("&")] for r in rows]


def _matrix_sum(s: str):
    """A sum or difference of written matrices of one shape ("\\begin{pmatrix}1&2\\end{pmatrix} +
    \\begin{pmatrix}3&4\\end{pmatrix}") as the matrix it evaluates to, entry by entry: exact
    numbers added exactly, other entries as the written sum; None for anything else."""
    found = list(_WRITTEN_MATRIX_RE.finditer(s))
    product = _matrix_product(s, found)
    if product is not None:
        return product
    signs, pos = [], 0
    for k, m in enumerate(found):
        gap = s[pos : m.start()].strip()
        if gap not in (("", "+", "-") if k == 0 else ("+", "-")):
            return None
        signs.append(-1 if gap == "-" else 1)
        pos = m.end()
    if len(found) < 2 or s[pos:].strip():
        return None
    matrices = [_matrix_rows(m.group(2)) for m in found]
    shape = [len(r) for r in matrices[0]]
    if any([len(r) for r in mat] != shape for mat in matrices):
        return None
    rows = []
    for i, width in enumerate(shape):
        row = []
        for j in range(width):
            cells = [mat[i][j] for mat in matrices]
            nums = [parse_number(c) for c in cells]
            if all(n is not None for n in nums):
                row.append(str(sum(sg * n.value for sg, n in zip(signs, nums))))
            else:
                row.append("".join(f"{'-' if sg < 0 else '+'}({c})" for sg, c in zip(signs, cells)).lstrip("+"))
        rows.append(row)
    return ("matrix", rows)


def _matrix_product(s: str, found: list[re.Match]):
    """A product of written matrices of numbers ("\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}
    \\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}", juxtaposed or with \\cdot/\\times) as the matrix it
    evaluates to, exactly; None for anything else (an entry that is no plain number, shapes that
    do not chain)."""
    gaps = [s[a.end() : b.start()].strip() for a, b in zip(found, found[1:])]
    if len(found) < 2 or s[: found[0].start()].strip() or s[found[-1].end() :].strip():
        return None
    if any(gap not in ("", "\\cdot", "\\times") for gap in gaps):
        return None
    result = None
    for m in found:
        rows = [[parse_number(c) for c in r] for r in _matrix_rows(m.group(2))]
        if not rows or any(n is None for r in rows for n in r) or len({len(r) for r in rows}) != 1:
            return None
        mat = [[n.value for n in r] for r in rows]
        if result is not None:
            if len(result[0]) != len(mat):
                return None
            mat = [[sum(a * b for a, b in zip(row, col)) for col in zip(*mat)] for row in result]
        result = mat
    return ("matrix", [[str(v) for v in row] for row in result])


def _item_texts(inner: str) -> list[str]:
    """The items of a tuple or set: comma-separated, or semicolon-separated when no comma
    separates them ("(0;1;2)", "\\{3; 1; 2\\}", as written where the comma is a decimal sign)."""
    parts = _split_top(inner, _COMMA)
    return _split_top(inner, _SEMI) if len(parts) == 1 else parts


def _items(parts: list[str]) -> list:
    """Parse container items, splicing "a \\pm b" into its two values ({1 \\pm 2, 5} has 3 items)."""
    out = []
    for p in parts:
        node = parse_structure(normalize_answer(p))
        if node[0] == "set" and len(node) == 3:
            out.extend(node[1])
        else:
            out.append(node)
    return out


_CONSTS = ("e", "i", "\\pi", "\\infty")
_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "=": "=", "!=": "!="}


def _as_interval(node):
    """x > a, a < x <= b, ... -> ("seq", ...) / x != a stays; None when not a 1-variable range."""
    if node[0] != "rel":
        return None
    pieces, ops = node[1], node[2]
    var_idx = [i for i, p in enumerate(pieces) if is_label(p) and p not in _CONSTS]
    if len(var_idx) != 1 or any(o not in ("<", ">", "<=", ">=") for o in ops):
        return None
    v = var_idx[0]
    lo, hi, lo_open, hi_open = "-\\infty", "\\infty", True, True
    for i, op in enumerate(ops):
        a, b = i, i + 1
        if v not in (a, b):
            return None
        other = pieces[b] if v == a else pieces[a]
        op_v = op if v == a else _FLIP[op]  # relation read as "x op other"
        if op_v in ("<", "<="):
            hi, hi_open = other, op_v == "<"
        else:
            lo, lo_open = other, op_v == ">"
    return ("seq", "(" if lo_open else "[", ")" if hi_open else "]", [("scalar", lo), ("scalar", hi)])


# A left side that is an operation to carry out, whose value the right side states: a limit, a
# sum, a product, an integral, a derivative, a determinant, an extremum, an expectation
# ("\\lim_{x\\to0} f(x) = 1", "\\frac{d}{dx}x^3 = 3x^2", "\\det M = 3", "E[X] = 2").
_OPERATION_LHS_RE = re.compile(
    r"^\\(?:lim|det|sum|prod|int|iint|iiint|oint|max|min|sup|inf|gcd|lcm|Pr)(?![a-zA-Z])"
    r"|^\\frac\{\s*(?:d|\\partial)\s*(?:\^\{?\d\}?)?\s*\}\s*\{\s*(?:d|\\partial)\s*[a-zA-Z]"
    r"|^(?:E|Var|Cov|P)\s*\["
)


def _is_assignment(node) -> bool:
    """ "x = 3", "AB = 4", a chain "x = 5+5+1 = 11", "\\sqrt{4} = 2" (a constant then its value), or
    an operation then its value ("\\lim_{x\\to0} f(x) = 1", `_OPERATION_LHS_RE`)."""
    if node[0] != "rel" or any(o != "=" for o in node[2]):
        return False
    lhs = node[1][0]
    return (
        len(node[1]) >= 3
        or bool(is_label(lhs) or FUNCTION_HEAD_RE.match(_squash(lhs)) or _OPERATION_LHS_RE.match(lhs))
        or (
            len(node[1]) == 2
            and not re.search(r"[a-zA-Z]", re.sub(r"\\[a-zA-Z]+", "", lhs))
            and parse_number(node[1][1]) is not None
        )
    )


def _labelled(items: list) -> list[str] | None:
    """The labels when every item is "label = value" ("k = 45, n = 2"), else None."""
    labels = []
    for it in items:
        if not (it[0] == "rel" and len(it[1]) == 2 and it[2] == ["="] and is_label(it[1][0])):
            return None
        labels.append(_squash(it[1][0]))
    return labels if len(set(labels)) == len(labels) else None


def _labelled_tuples(node):
    """ "p=5,q=2;p=7,q=2" -> the list of tuples (5,2),(7,2): labels repeating in the same cycle,
    each round one tuple in the order of the first round's labels; None otherwise."""
    items = node[1]
    labels = []
    for it in items:
        if not (it[0] == "rel" and len(it[1]) == 2 and it[2] == ["="] and is_label(it[1][0])):
            return None
        labels.append(_squash(it[1][0]))
    k = len(set(labels))
    if k < 2 or len(items) % k or len(items) == k or any(labels[i] != labels[i % k] for i in range(len(items))):
        return None
    values = [parse_structure(normalize_answer(it[1][1])) for it in items]
    return ("list", [("seq", "(", ")", values[i : i + k]) for i in range(0, len(values), k)], ",")


def _compare_labelled(p, g, scalar_eq, relation_eq) -> bool | None:
    """Lists where one side labels its values: both labelled -> matched by label; one side
    labelled, the other bare values -> matched in order. None when neither applies."""
    lp, lg = _labelled(p[1]), _labelled(g[1])
    if lp is None and lg is None:
        return None
    if len(p[1]) != len(g[1]):
        return False

    def value(it):
        return parse_structure(normalize_answer(it[1][1]))

    if lp is not None and lg is not None:
        if sorted(lp) != sorted(lg):
            return False
        by_label = dict(zip(lg, g[1]))
        return all(compare_structures(value(a), value(by_label[k]), scalar_eq, relation_eq) for k, a in zip(lp, p[1]))
    if any(it[0] == "rel" for it in (g[1] if lp is not None else p[1])):
        return None
    pv = [value(it) for it in p[1]] if lp is not None else p[1]
    gv = [value(it) for it in g[1]] if lg is not None else g[1]
    return all(compare_structures(a, b, scalar_eq, relation_eq) for a, b in zip(pv, gv))


ScalarEq = Callable[[str, str], bool]
RelationEq = Callable[[list, list, list, list], bool]


def compare_structures(p, g, scalar_eq: ScalarEq, relation_eq: RelationEq) -> bool:
    """Equivalence of two parsed answers; `scalar_eq` may raise NeedSymbolic."""
    kp, kg = p[0], g[0]
    if kp == "rel" or kg == "rel":
        if kp == "rel" and kg == "rel":
            if _function_pair(p, g):  # "f(x) = 2x+3" vs "y = 2x+3": the same function, named twice
                return compare_structures(
                    parse_structure(normalize_answer(p[1][1])),
                    parse_structure(normalize_answer(g[1][1])),
                    scalar_eq,
                    relation_eq,
                )
            if _is_assignment(p) and _is_assignment(g) and _squash(p[1][0]) == _squash(g[1][0]):
                return compare_structures(
                    parse_structure(normalize_answer(p[1][-1])),
                    parse_structure(normalize_answer(g[1][-1])),
                    scalar_eq,
                    relation_eq,
                )
            if _is_assignment(p) and _is_assignment(g) and len(p[1]) >= 3:
                return compare_structures(parse_structure(p[1][-1]), g, scalar_eq, relation_eq)
            if len(p[1]) == 2 and len(g[1]) == 2:
                return relation_eq(p[1], p[2], g[1], g[2])
            return _squash("".join(p[1])) == _squash("".join(g[1])) and p[2] == g[2]
        rel, other, rel_is_pred = (p, g, True) if kp == "rel" else (g, p, False)
        if _is_assignment(rel):
            value = parse_structure(normalize_answer(rel[1][-1]))
            return (
                compare_structures(value, other, scalar_eq, relation_eq)
                if rel_is_pred
                else compare_structures(other, value, scalar_eq, relation_eq)
            )
        iv = _as_interval(rel)
        if iv is not None and other[0] in ("seq", "union"):
            return (
                compare_structures(iv, other, scalar_eq, relation_eq)
                if rel_is_pred
                else compare_structures(other, iv, scalar_eq, relation_eq)
            )
        return False
    if kp == "scalar" and kg == "scalar":
        return scalar_eq(p[1], g[1])
    if kp == "matrix" or kg == "matrix":
        return _compare_matrix(p, g, scalar_eq)
    if kp in ("set", "list") and kg in ("set", "list"):
        tuples_p = _labelled_tuples(p) if kp == "list" else None
        tuples_g = _labelled_tuples(g) if kg == "list" else None
        if tuples_p is not None or tuples_g is not None:
            return _match_unordered((tuples_p or p)[1], (tuples_g or g)[1], scalar_eq, relation_eq)
        labelled = _compare_labelled(p, g, scalar_eq, relation_eq)
        if labelled is not None:
            return labelled
        return _match_unordered(_once(p[1], g[1]), g[1], scalar_eq, relation_eq)
    if kp == "seq" and kg == "seq":
        if (p[1], p[2]) != (g[1], g[2]) or len(p[3]) != len(g[3]):
            return False
        return all(compare_structures(a, b, scalar_eq, relation_eq) for a, b in zip(p[3], g[3]))
    if {kp, kg} == {"seq", "list"}:  # "(3, 4)" vs "3, 4": same items in the same order
        seq, lst = (p, g) if kp == "seq" else (g, p)
        if (seq[1], seq[2]) != ("(", ")") or len(seq[3]) != len(lst[1]):
            return False
        pairs = zip(p[3], g[1]) if kp == "seq" else zip(p[1], g[3])
        return all(compare_structures(a, b, scalar_eq, relation_eq) for a, b in pairs)
    if kp == "union" and kg == "union":
        return _match_unordered(p[1], g[1], scalar_eq, relation_eq)
    if kp == "set" and kg == "scalar" and len(p[1]) == 1:  # "\{5\}" vs "5"
        return compare_structures(p[1][0], g, scalar_eq, relation_eq)
    if kg == "set" and kp == "scalar" and len(g[1]) == 1:
        return compare_structures(p, g[1][0], scalar_eq, relation_eq)
    return False


def _once(ps: list, gs: list) -> list:
    """The prediction's items, each written once, when the gold writes none twice: a solution set
    that lists one solution again ("(3,17,3,7), ..., (3, 17, 3, 7)") names the same set. Only
    items written alike (spaces aside) are the same; a gold with a repeated item (a double root)
    keeps the count."""

    def key(node):
        return repr(node).replace(" ", "")

    if len({key(n) for n in gs}) < len(gs):
        return ps
    seen: set[str] = set()
    out = []
    for n in ps:
        if key(n) not in seen:
            seen.add(key(n))
            out.append(n)
    return out


def _function_pair(p, g) -> bool:
    """Both sides define a function under different heads ("f(x) = ...", "y = ...", "g(t) = ...")."""
    if len(p[1]) != 2 or len(g[1]) != 2 or p[2] != ["="] or g[2] != ["="]:
        return False
    hp, hg = _squash(p[1][0]), _squash(g[1][0])
    return hp != hg and bool(FUNCTION_HEAD_RE.match(hp) and FUNCTION_HEAD_RE.match(hg))


def _match_unordered(ps: list, gs: list, scalar_eq: ScalarEq, relation_eq: RelationEq) -> bool:
    """Multiset equality under the equivalence (greedy matching; items are few)."""
    if len(ps) != len(gs):
        return False
    left = list(gs)
    pending: Exception | None = None
    for a in ps:
        for j, b in enumerate(left):
            try:
                if compare_structures(a, b, scalar_eq, relation_eq):
                    del left[j]
                    break
            except NeedSymbolic as e:
                pending = e
        else:
            if pending is not None:
                raise pending
            return False
    return True


def _compare_matrix(p, g, scalar_eq: ScalarEq) -> bool:
    def rows(n):
        if n[0] == "matrix":
            return n[1]
        if n[0] == "seq" and (n[1], n[2]) == ("(", ")") and all(i[0] == "scalar" for i in n[3]):
            return [[i[1]] for i in n[3]]  # a tuple compares with a column vector
        return None

    rp, rg = rows(p), rows(g)
    if rp is None or rg is None:
        raise Undecided("a matrix against something else")
    if len(rp) == 1 and len(rg) > 1 and all(len(r) == 1 for r in rg):
        rp = [[c] for c in rp[0]]  # row vector vs column vector: same entries
    if len(rp) != len(rg) or any(len(a) != len(b) for a, b in zip(rp, rg)):
        return False
    return all(scalar_eq(a, b) for ra, rb in zip(rp, rg) for a, b in zip(ra, rb))


def leaf_texts(node) -> list[str]:
    """The scalar texts of a parsed answer (relation sides, items, interval ends)."""
    kind = node[0]
    if kind == "scalar":
        return [node[1]]
    if kind == "rel":
        return list(node[1])
    if kind == "seq":
        return [t for it in node[3] for t in leaf_texts(it)]
    if kind in ("set", "list", "union"):
        return [t for it in node[1] for t in leaf_texts(it)]
    return []


_NAME_RUN_RE = re.compile(r"(?<!\\)\b[a-zA-Z]+\b")


def _variables(node) -> set[str] | None:
    """The one-letter names an answer writes (e, i and function names aside); None when it
    writes a longer name (a word, a multi-letter label)."""
    names: set[str] = set()
    for text in leaf_texts(node):
        t = re.sub(r"\\[a-zA-Z]+|\babs(?=\()", " ", text)
        for run in _NAME_RUN_RE.findall(t):
            if len(run) > 1:
                return None
            names.add(run)
    return names - {"e", "i"}


def _open_condition(node) -> bool:
    """More than values or plain assignments: an equation to solve, an inequality, a conjunction."""
    kind = node[0]
    if kind == "rel":
        if _OPERATION_LHS_RE.match(node[1][0]) and all(o == "=" for o in node[2]):
            return False  # "\\lim_{x\\to0} f(x) = 1" states a value, not a condition on x
        return any(o != "=" for o in node[2]) or not is_label(node[1][0]) or len(node[1]) > 2
    if kind == "list":
        return node[2] == "and" or any(_open_condition(it) for it in node[1])
    return False


def solution_pair(p, g) -> bool:
    """Both answers read as conditions on (or values of) the same one variable, at least one of
    them a condition: their solution sets over the reals can decide (`envs.grading._solution_sets`)."""
    kinds = ("rel", "list", "seq", "union", "set", "scalar")
    if p[0] not in kinds or g[0] not in kinds or not (_open_condition(p) or _open_condition(g)):
        return False
    vp, vg = _variables(p), _variables(g)
    return vp is not None and vg is not None and len(vp | vg) == 1
