"""docs/metrics.md describes every key a run writes to metrics.jsonl (and the keys of the
functions that produce them). The end-to-end run checks its own metrics.jsonl against it too
(tests/trainer/test_trainer_e2e.py); this test catches a new key at its source, in a second."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented_keys() -> set[str]:
    """The keys of docs/metrics.md: the backticked first cell of each table row."""
    keys = set()
    for line in DOC.read_text().splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|", line)
        if m:
            keys.add(m.group(1))
    return keys | {"step"}  # every row's step is described in the page's text


def missing_from_doc(keys) -> str:
    """'' when every key is documented, else what to add where (the failure message)."""
    missing = sorted(set(keys) - documented_keys())
    if not missing:
        return ""
    return (
        f"metrics.jsonl keys not described in docs/metrics.md: {missing}. Add a row "
        "`| `<key>` | what it measures | unit |` to the table of the key's prefix (a new prefix gets "
        "its own section)."
    )


def test_every_table_row_has_a_unit():
    rows = [line for line in DOC.read_text().splitlines() if re.match(r"\|\s*`[^`]+/[^`]+`\s*\|", line)]
    assert len(rows) > 60
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) >= 3 and cells[1] and cells[-1], row


def test_the_metric_producers_write_only_documented_keys():
    import torch

    from stare_tir.algos.advantage import ADVANTAGE_ESTIMATORS
    from stare_tir.algos.stare import StareConfig, StareController, stare_token_weights
    from stare_tir.rollout.engine import rollout_stats

    keys = set(rollout_stats([]))  # every key, even for an empty batch
    _, adv = ADVANTAGE_ESTIMATORS.get("grpo")(torch.tensor([1.0, -1.0]), torch.tensor([0, 0]))
    keys |= set(adv)
    _, stare = stare_token_weights(torch.rand(8), torch.tensor([1.0] * 4 + [-1.0] * 4), variant="C2")
    keys |= set(stare) | set(StareController.from_config(StareConfig()).metrics())
    assert not missing_from_doc(keys), missing_from_doc(keys)


def test_the_check_names_the_key_and_where_to_add_it():
    message = missing_from_doc(["reward/mean", "new/metric"])
    assert "['new/metric']" in message and "docs/metrics.md" in message and "reward/mean" not in message
