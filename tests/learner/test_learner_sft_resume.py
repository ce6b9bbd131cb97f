"""SFT checkpoints: a stare-sft killed with SIGKILL continues from its last checkpoint when the same
command runs again, and ends with the weights of a run that was never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SFT = ROOT / "scripts" / "sft_coldstart.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def traces(path: Path, n: int) -> Path:
    rows = []
    for i in range(n):
        a, b = i % 17, (3 * i) % 11
        code = f"<code>\n```python\nprint({a} + {b})\n```\n</code>\n"
        answer = code + f"<interpreter>\n{a + b}\n</interpreter>\n\\boxed{{{a + b}}}"
        rows.append(
            {"messages": [{"role": "user", "content": f"{a} + {b}?"}, {"role": "assistant", "content": answer}]}
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def command(data: Path, out: Path) -> list[str]:
    keys = ["sft.train.epochs=2", "sft.train.batch_size=2", "sft.train.save_every=2", "sft.train.log_every=1"]
    return [sys.executable, str(SFT), "--model", "tiny", "--data", str(data), "--output", str(out), *keys]


@pytest.mark.slow
def test_sft_killed_then_rerun_continues_from_its_checkpoint_to_the_same_weights(tmp_path):
    import torch
    from safetensors.torch import load_file

    data = traces(tmp_path / "traces.jsonl", 60)  # 2 epochs x 30 steps
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    child = subprocess.Popen(
        command(data, killed), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    latest = tmp_path / "killed.checkpoints" / "latest"
    deadline = time.time() + 300
    while time.time() < deadline and not latest.is_file() and child.poll() is None:
        time.sleep(0.2)
    assert child.poll() is None, "SFT ended before it could be killed"
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert not (killed / "config.json").exists()

    r = subprocess.run(command(data, killed), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "resumed_from=" in r.stdout and "steps=60" in r.stdout, r.stdout
    assert not (tmp_path / "killed.checkpoints").exists()  # the model is written: checkpoints gone

    r = subprocess.run(command(data, reference), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    a, b = load_file(killed / "model.safetensors"), load_file(reference / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
