"""envs.data: shipped sets, formats, field mapping, validation (error and skip), overlap."""

from __future__ import annotations

import gzip
import json
import re
import sys
import types

import pytest
from loguru import logger

from envs.data import EVAL_SETS, DataError, load_problems, load_problems_report

COUNTS = {
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "math500": 500,
    "minerva": 272,
    "olympiadbench": 675,
    "dapo17k": 17176,
}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_shipped_sets(name):
    probs = load_problems(name)
    assert len(probs) == COUNTS[name]
    assert len({p["id"] for p in probs}) == len(probs)
    for p in probs:
        assert isinstance(p["problem"], str) and p["problem"].strip()
        assert isinstance(p["answer"], str) and p["answer"].strip()
        assert "source" in p  # extra fields are kept


def test_shipped_spot_checks():
    aime = {p["id"]: p["answer"] for p in load_problems("aime24")}
    assert aime["aime2024-I-1"] == "204" and aime["aime2024-II-4"] == "33"
    dapo = load_problems("dapo17k", limit=27)
    assert dapo[0]["id"] == "dapo17k-0" and dapo[0]["answer"] == "34"
    assert all(re.fullmatch(r"-?\d+", p["answer"]) for p in load_problems("dapo17k", limit=2000))


@pytest.mark.parametrize(
    "name,kept",
    [("dapo17k", 17074), ("amc23", 16), ("math500", 477), ("olympiadbench", 620), ("aime24", 30), ("minerva", 272)],
)
def test_exclude_overlap(name, kept):
    probs, report = load_problems_report(name, exclude_overlap=True)
    assert len(probs) == kept and report["excluded_overlap"] == COUNTS[name] - kept


def test_exclude_overlap_removes_the_listed_pair():
    ids = {p["id"] for p in load_problems("dapo17k", exclude_overlap=True)}
    assert "dapo17k-15860" not in ids  # = amc2023-12A-12
    assert "amc2023-12A-12" not in {p["id"] for p in load_problems("amc23", exclude_overlap=True)}


def test_exclude_overlap_checks_a_custom_file_by_text_and_says_what_it_skipped(tmp_path):
    aime = load_problems("aime24")[0]["problem"]
    f = tmp_path / "x.jsonl"
    rows = [
        {"problem": "What is 2+3?", "answer": "5"},
        {"problem": "  " + aime.upper().replace(" ", "\n  ") + " ", "answer": "204"},  # same text, reflowed
        {"problem": "What is 7*6?", "answer": "42"},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    messages: list[str] = []
    sink = logger.add(messages.append, level="WARNING", format="{message}")
    try:
        probs, report = load_problems_report(str(f), exclude_overlap=True)
    finally:
        logger.remove(sink)
    assert [p["answer"] for p in probs] == ["5", "42"]
    assert report["excluded_overlap"] == 1 and report["overlap_check"] == "text"
    assert any("curated overlap list" in m and "reworded duplicates are not detected" in m for m in messages)
    # Without the flag nothing is excluded.
    assert len(load_problems(str(f))) == 3


def test_eval_set_names():
    assert set(EVAL_SETS) == set(COUNTS) - {"dapo17k"}


# ----------------------------------------------------------------------------- validation

ROWS = [
    {"id": "a", "problem": "1+1?", "answer": "2"},
    {"id": "b", "answer": "3"},  # 2: missing problem
    {"id": "c", "problem": "list answer", "answer": ["1", "2"]},  # 3: wrong type
    {"id": "a", "problem": "other", "answer": "4"},  # 4: duplicate id
    {"id": "e", "problem": "1+1?", "answer": "2"},  # 5: duplicate problem
    None,  # 6: invalid JSON (written raw below)
    {"id": "g", "problem": "empty answer", "answer": "  "},  # 7
    {"id": "h", "problem": "bool answer", "answer": True},  # 8
    {"id": 9, "problem": "int answer and id", "answer": 27},  # 9: coerced
    {"id": "j", "problem": "float answer", "answer": 27.0},  # 10: coerced to "27"
    [1, 2],  # 11: not an object
    {"problem": "no id", "answer": "5", "extra": {"k": 1}},  # 12: id generated, extra kept
]


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write("{not json\n" if r is None else json.dumps(r) + "\n")


def test_bad_row_raises_naming_file_and_row(tmp_path):
    f = tmp_path / "probs.jsonl"
    write_jsonl(f, ROWS)
    with pytest.raises(DataError) as e:
        load_problems(str(f))
    assert str(f) in str(e.value) and "row 2" in str(e.value) and "missing problem" in str(e.value)


@pytest.mark.parametrize(
    "row,needle",
    [
        ({"id": "x", "answer": "3"}, "missing problem"),
        ({"id": "x", "problem": "p"}, "missing answer"),
        ({"id": "x", "problem": "p", "answer": None}, "missing answer"),
        ({"id": "x", "problem": 5, "answer": "1"}, "problem has type int"),
        ({"id": "x", "problem": "p", "answer": [1]}, "answer has type list"),
        ({"id": "x", "problem": "p", "answer": True}, "answer has type bool"),
        ({"id": "x", "problem": " ", "answer": "1"}, "empty problem"),
        ({"id": 1.5, "problem": "p", "answer": "1"}, "id has type float"),
        ({"id": "x", "problem": "p", "answer": float("nan")}, "answer is nan"),
    ],
)
def test_each_kind_of_bad_row(tmp_path, row, needle):
    f = tmp_path / "one.json"
    f.write_text(json.dumps([{"id": "ok", "problem": "fine", "answer": "1"}, row]))
    with pytest.raises(DataError, match=rf"one\.json: row 2: {re.escape(needle)}"):
        load_problems(str(f))


def test_skip_mode_counts_and_logs_every_dropped_row(tmp_path):
    f = tmp_path / "probs.jsonl"
    write_jsonl(f, ROWS)
    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(str(m)), level="WARNING", format="{message}")
    try:
        probs, report = load_problems_report(str(f), on_bad_row="skip")
    finally:
        logger.remove(sink)
    assert [p["id"] for p in probs] == ["a", "9", "j", "probs-12"]
    assert [p["answer"] for p in probs] == ["2", "27", "27", "5"]
    assert probs[3]["extra"] == {"k": 1}
    assert report["skipped"] == 8 and report["rows_read"] == 12 and report["loaded"] == 4
    assert report["skipped_by_reason"] == {
        "missing_problem": 1,
        "bad_type_answer": 2,
        "duplicate_id": 1,
        "duplicate_problem": 1,
        "invalid_json": 1,
        "empty_answer": 1,
        "not_an_object": 1,
    }
    per_row = [m for m in messages if "-> skipped" in m]
    assert len(per_row) == 8
    for row in (2, 3, 4, 5, 6, 7, 8, 11):
        assert any(f"row {row}:" in m for m in per_row), row
    assert any("skipped 8 bad rows of 12" in m for m in messages)


def test_limit_stops_early(tmp_path):
    f = tmp_path / "p.jsonl"
    write_jsonl(f, [{"problem": f"q{i}", "answer": str(i)} for i in range(10)] + [None])
    assert [p["answer"] for p in load_problems(str(f), limit=3)] == ["0", "1", "2"]
    with pytest.raises(DataError, match="row 11"):
        load_problems(str(f))


# ----------------------------------------------------------------------------- formats and mapping

VERL_ROWS = [
    {
        "prompt": [{"role": "user", "content": f"Problem {i}"}],
        "reward_model": {"ground_truth": str(i * 2)},
        "extra_info": {"index": i},
    }
    for i in range(3)
]
VERL_FIELDS = {"problem": "prompt.0.content", "answer": "reward_model.ground_truth", "id": "extra_info.index"}


def check_verl(probs):
    assert [(p["id"], p["problem"], p["answer"]) for p in probs] == [
        ("0", "Problem 0", "0"),
        ("1", "Problem 1", "2"),
        ("2", "Problem 2", "4"),
    ]


def test_parquet_with_dotted_field_paths(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(VERL_ROWS), f)
    check_verl(load_problems(str(f), fields=VERL_FIELDS))


def test_json_list_and_wrapped_object(tmp_path):
    f1, f2 = tmp_path / "a.json", tmp_path / "b.json"
    f1.write_text(json.dumps(VERL_ROWS))
    f2.write_text(json.dumps({"data": VERL_ROWS}))
    check_verl(load_problems(str(f1), fields=VERL_FIELDS))
    check_verl(load_problems(str(f2), fields=VERL_FIELDS))


def test_gzip_jsonl_and_renamed_fields(tmp_path):
    f = tmp_path / "q.jsonl.gz"
    with gzip.open(f, "wt") as g:
        for i in range(3):
            g.write(json.dumps({"question": f"Q{i}", "final": str(i), "uid": f"u{i}"}) + "\n")
    probs = load_problems(str(f), fields={"problem": "question", "answer": "final", "id": "uid"})
    assert [(p["id"], p["problem"], p["answer"]) for p in probs] == [
        ("u0", "Q0", "0"),
        ("u1", "Q1", "1"),
        ("u2", "Q2", "2"),
    ]
    assert "question" not in probs[0]  # mapped columns are not duplicated as extras


def test_hugging_face_source(monkeypatch):
    calls = []

    def load_dataset(name, split):
        calls.append((name, split))
        return [{"question": "Q", "answer": 7}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    probs = load_problems("hf:someone/some-set:test", fields={"problem": "question"})
    assert calls == [("someone/some-set", "test")]
    assert probs[0]["problem"] == "Q" and probs[0]["answer"] == "7"
    load_problems("someone/other", fields={"problem": "question"})
    assert calls[-1] == ("someone/other", "train")


def test_unknown_sources(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_problems("does-not-exist.jsonl")
    f = tmp_path / "x.csv"
    f.write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type"):
        load_problems(str(f))
    with pytest.raises(ValueError, match="fields"):
        load_problems("aime24", fields={"question": "q"})
    with pytest.raises(ValueError, match="on_bad_row"):
        load_problems("aime24", on_bad_row="ignore")
