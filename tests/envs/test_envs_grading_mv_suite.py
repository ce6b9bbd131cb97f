"""math-verify 0.9.0's own test cases, graded by our builtin grader (CPU; needs PyPI once).

The sdist is downloaded with pip (pinned by version and sha256) and cached; without network this
test fails under CI=true and is skipped elsewhere. The cases it fixed are also plain rows of
tests/envs/grading_cases.py, tested offline.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("mv_suite", ROOT / "scripts/bench/bench_grading_mv_suite.py")
suite = importlib.util.module_from_spec(_spec)
sys.modules["mv_suite"] = suite  # (its dataclasses look their module up)
assert _spec.loader is not None
_spec.loader.exec_module(suite)

MIN_AGREE = 268  # of 283; the rest: deliberate refusals, doubled-backslash artifacts, listed misses


@pytest.fixture(scope="module")
def cases():
    try:
        return suite.load_cases()
    except (subprocess.SubprocessError, OSError) as e:
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(f"math-verify {suite.VERSION} sdist not available: {e}")
        pytest.skip(f"math-verify {suite.VERSION} sdist not available (no network?): {e}")


def test_math_verify_suite_agrees_without_false_positives(cases):
    from envs.grading import Grader

    assert len(cases) == suite.TOTAL
    grader = Grader("builtin", cache_size=0)
    report = suite.grade_suite(cases, grader.grade)
    grader.close()
    assert report.false_positives == [], report.result_line()
    assert report.agree >= MIN_AGREE, report.result_line()
    assert len(report.deliberate) == len(suite.DELIBERATE)  # kept refused: close decimals, ...
