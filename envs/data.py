"""Loading and validating math problems.

    load_problems("aime24")                                   # a shipped set, by short name
    load_problems("dapo17k", exclude_overlap=True)            # minus problems that leak eval sets
    load_problems("my.parquet", fields={"problem": "prompt.0.content",
                                        "answer": "reward_model.ground_truth"})
    load_problems("hf:org/name:test", on_bad_row="skip")      # a Hugging Face dataset (needs `datasets`)

Every problem is a dict {"id": str, "problem": str, "answer": str, ...the row's other fields}
(`fields={"answer": ""}`: a dataset without gold answers, for a reward function of one's own that
grades from the row's other fields; every answer is then "").
Every row is validated: a missing or empty problem/answer, a wrong type, a duplicate id or a
duplicate problem text is a bad row. With on_bad_row="error" (the default) the first bad row raises
`DataError` naming the file and the row; with "skip" each bad row is logged (loguru) with its reason,
counted, and the counts are logged at the end. Nothing is dropped silently.

Sources: a short name of a shipped set (see `SHIPPED`), a path ending in .jsonl, .jsonl.gz, .json
or .parquet, or a Hugging Face dataset written "hf:<owner>/<name>[:<split>]" (or "<owner>/<name>"
when no such local path exists); the split defaults to "train".
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Literal

from loguru import logger

DATA_DIR = Path(__file__).resolve().parent / "data"

# Short name -> shipped file (sources and licenses in envs/data/README.md).
SHIPPED: dict[str, str] = {
    "aime24": "aime24.jsonl",
    "aime25": "aime25.jsonl",
    "amc23": "amc23.jsonl",
    "math500": "math500.jsonl",
    "minerva": "minerva.jsonl",
    "olympiadbench": "olympiadbench.jsonl",
    "dapo17k": "dapo17k.jsonl.gz",
}
EVAL_SETS = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")
OVERLAP_FILE = "dapo_eval_overlap.json"
# Keys of the overlap file (named after the upstream eval files).
_OVERLAP_KEYS = {
    "aime24": "aime24.jsonl",
    "aime25": "aime25.jsonl",
    "amc23": "amc23.jsonl",
    "math500": "math500.jsonl",
    "minerva": "minerva_math.jsonl",
    "olympiadbench": "olympiadbench.jsonl",
}


class DataError(ValueError):
    """A bad row (or source), with the file and row in the message."""


def load_problems(
    source: str,
    *,
    fields: dict | None = None,
    on_bad_row: Literal["error", "skip"] = "error",
    limit: int | None = None,
    exclude_overlap: bool = False,
) -> list[dict]:
    """Validated problems from `source` (see module docstring)."""
    return load_problems_report(
        source, fields=fields, on_bad_row=on_bad_row, limit=limit, exclude_overlap=exclude_overlap
    )[0]


def load_problems_report(
    source: str,
    *,
    fields: dict | None = None,
    on_bad_row: Literal["error", "skip"] = "error",
    limit: int | None = None,
    exclude_overlap: bool = False,
) -> tuple[list[dict], dict]:
    """Like load_problems, plus a report: rows read, loaded, skipped (by reason), excluded."""
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"on_bad_row={on_bad_row!r}: must be 'error' or 'skip'")
    mapping = {"problem": "problem", "answer": "answer", "id": "id"}
    if fields:
        unknown = set(fields) - set(mapping)
        if unknown:
            raise ValueError(f"fields={fields!r}: keys must be among {sorted(mapping)}")
        mapping.update(fields)
    name, rows = _open_source(source)
    excluded_ids = _overlap_ids(source) if exclude_overlap else set()
    # A source outside the curated overlap list is checked by problem text instead (see below).
    eval_texts = _eval_texts() if exclude_overlap and source not in SHIPPED else {}

    problems: list[dict] = []
    skipped: Counter = Counter()
    seen_ids: dict[str, int] = {}
    seen_texts: dict[str, int] = {}
    n_rows = n_excluded = 0
    for row_no, row in rows:
        n_rows += 1
        try:
            prob = _validate(row, row_no, mapping, Path(name).name.split(".")[0])
            if prob["id"] in seen_ids:
                raise _BadRow("duplicate_id", f"duplicate id {prob['id']!r} (first at row {seen_ids[prob['id']]})")
            text_key = re.sub(r"\s+", " ", prob["problem"].strip())
            if text_key in seen_texts:
                raise _BadRow("duplicate_problem", f"duplicate problem text (same as row {seen_texts[text_key]})")
        except _BadRow as e:
            if on_bad_row == "error":
                raise DataError(f"{name}: row {row_no}: {e.message}") from None
            skipped[e.kind] += 1
            logger.warning("{}: row {}: {} -> skipped", name, row_no, e.message)
            continue
        seen_ids[prob["id"]] = row_no
        seen_texts[text_key] = row_no
        if prob["id"] in excluded_ids or text_key.casefold() in eval_texts:
            n_excluded += 1
            continue
        problems.append(prob)
        if limit is not None and len(problems) >= limit:
            break
    report = {
        "source": name,
        "rows_read": n_rows,
        "loaded": len(problems),
        "skipped": sum(skipped.values()),
        "skipped_by_reason": dict(skipped),
        "excluded_overlap": n_excluded,
    }
    if skipped:
        logger.warning(
            "{}: skipped {} bad rows of {} read ({})",
            name,
            report["skipped"],
            n_rows,
            ", ".join(f"{k}={v}" for k, v in sorted(skipped.items())),
        )
    if exclude_overlap and source in SHIPPED:
        logger.info("{}: excluded {} problems overlapping DAPO-17k/eval sets", name, n_excluded)
    elif exclude_overlap:
        report["overlap_check"] = "text"
        logger.warning(
            "{}: not a shipped set, so the curated overlap list (near-duplicates found by hand) does not "
            "apply; checked exact problem text (whitespace and case folded) against the {} shipped eval "
            "sets instead and excluded {}; reworded duplicates are not detected",
            name,
            len(EVAL_SETS),
            n_excluded,
        )
    return problems, report


# ----------------------------------------------------------------------------- validation


class _BadRow(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


_MISSING = object()


def _get(row: Any, path: str) -> Any:
    """row["a"]["b"][0] for path "a.b.0"; _MISSING when absent. An exact key wins over a path."""
    if isinstance(row, dict) and path in row:
        return row[path]
    cur = row
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, (list, tuple)) and part.lstrip("-").isdigit() and -len(cur) <= int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return _MISSING
    return cur


def _text_field(row: dict, path: str, what: str) -> str:
    v = _get(row, path)
    if v is _MISSING or v is None:
        keys = sorted(row)[:12]
        raise _BadRow(f"missing_{what}", f"missing {what} (field {path!r}; row has {keys})")
    if isinstance(v, bool):
        raise _BadRow(f"bad_type_{what}", f"{what} has type bool, expected a string")
    if what == "answer" and isinstance(v, int):
        v = str(v)
    elif what == "answer" and isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise _BadRow("bad_type_answer", f"answer is {v!r}")
        v = str(int(v)) if v.is_integer() else repr(v)  # 27.0 (upstream float) -> "27"
    if not isinstance(v, str):
        raise _BadRow(f"bad_type_{what}", f"{what} has type {type(v).__name__}, expected a string")
    if not v.strip():
        raise _BadRow(f"empty_{what}", f"empty {what}")
    return v


def _validate(row: Any, row_no: int, mapping: dict, stem: str) -> dict:
    if isinstance(row, _Unparsable):
        raise _BadRow("invalid_json", f"invalid JSON ({row.error})")
    if not isinstance(row, dict):
        raise _BadRow("not_an_object", f"row is a {type(row).__name__}, expected an object")
    problem = _text_field(row, mapping["problem"], "problem")
    # fields={"answer": ""}: the rows carry no gold answer (a reward function, env.reward, grades them
    # from their own fields, which every problem keeps)
    answer = _text_field(row, mapping["answer"], "answer").strip() if mapping["answer"] else ""
    rid = _get(row, mapping["id"])
    if rid is _MISSING or rid is None:
        rid = f"{stem}-{row_no}"
    elif isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise _BadRow("bad_type_id", f"id has type {type(rid).__name__}, expected a string or integer")
    rid = str(rid)
    if not rid.strip():
        raise _BadRow("empty_id", "empty id")
    top_keys = {mapping[k].split(".")[0] for k in mapping if mapping[k]} | {"id", "problem", "answer"}
    out = {k: v for k, v in row.items() if k not in top_keys}
    out.update(id=rid, problem=problem, answer=answer)
    return out


# ----------------------------------------------------------------------------- sources


def _open_source(source: str) -> tuple[str, Iterator[tuple[int, Any]]]:
    """(name for messages, iterator of (1-based row number, row))."""
    if source in SHIPPED:
        path = DATA_DIR / SHIPPED[source]
        return str(path), _read_file(path)
    path = Path(source).expanduser()
    if path.exists():
        return str(path), _read_file(path)
    if source.startswith("hf:") or re.fullmatch(r"[\w.-]+/[\w.-]+(?::[\w.\[\]%:-]+)?", source):
        return source, _read_hf(source.removeprefix("hf:"))
    raise DataError(f"{source}: no such file, shipped set ({', '.join(SHIPPED)}) or 'hf:' dataset")


def _read_file(path: Path) -> Iterator[tuple[int, Any]]:
    name = path.name.lower()
    if name.endswith(".jsonl") or name.endswith(".jsonl.gz"):
        return _read_jsonl(path)
    if name.endswith(".json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):  # {"data": [...]} or any single list-valued key
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise DataError(f"{path}: expected a list of rows or an object holding one list")
            data = lists[0]
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a list of rows")
        return iter(enumerate(data, start=1))
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq  # only parquet sources pay for pyarrow

        return iter(enumerate(pq.read_table(path).to_pylist(), start=1))
    raise DataError(f"{path}: unsupported file type (use .jsonl, .jsonl.gz, .json or .parquet)")


def _read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):  # row number = line number
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as e:
                yield line_no, _Unparsable(str(e))


class _Unparsable:
    def __init__(self, error: str) -> None:
        self.error = error


def _read_hf(spec: str) -> Iterator[tuple[int, Any]]:
    name, _, split = spec.partition(":")
    try:
        import datasets  # optional, heavy: only Hugging Face sources pay for it
    except ImportError as e:
        raise DataError(f"hf:{spec}: the `datasets` package is needed for Hugging Face sources") from e
    ds = datasets.load_dataset(name, split=split or "train")
    return iter(enumerate(ds, start=1))


def _overlap_ids(source: str) -> set[str]:
    """Ids to drop from a shipped `source` because the same problem is in DAPO-17k and an eval set
    (empty for other sources: those are checked by text, `_eval_texts`)."""
    data = json.loads((DATA_DIR / OVERLAP_FILE).read_text(encoding="utf-8"))["overlaps"]
    if source == "dapo17k":
        return {p["train_id"] for pairs in data.values() for p in pairs}
    if source in EVAL_SETS:
        return {p["eval_id"] for p in data.get(_OVERLAP_KEYS[source], [])}
    return set()


def _eval_texts() -> dict[str, str]:
    """Problem text of every shipped eval set (whitespace collapsed, case folded) -> its set."""
    texts: dict[str, str] = {}
    for name in EVAL_SETS:
        for prob in load_problems(name):
            texts[re.sub(r"\s+", " ", prob["problem"].strip()).casefold()] = name
    return texts
