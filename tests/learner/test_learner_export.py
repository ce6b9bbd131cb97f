"""stare-export: an intermediate checkpoint of a 2-rank ZeRO-3 run becomes an HF model that gives
the learner's own log-probs and entropies at that step."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "export_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_two_ranks(run_dir: Path, stage: int) -> None:
    port, procs, logs = _free_port(), [], []
    run_dir.mkdir(parents=True)
    for rank in range(2):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "OMP_NUM_THREADS": "1",
        }
        logs.append(run_dir / f"worker.rank{rank}.log")
        with open(logs[-1], "w") as f:  # a file, not a pipe: a rank blocked on a full pipe hangs the other
            cmd = [sys.executable, str(WORKER), str(run_dir), "--zero-stage", str(stage)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT))
    try:
        for p in procs:
            p.wait(timeout=300)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank} failed (exit {p.returncode}):\n{log.read_text()[-4000:]}"


def hf_logprobs_entropy(model, prompt: list[int], response: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # [R, V]: predicts each response token
    logp = torch.log_softmax(logits, -1)
    return logp.gather(1, torch.tensor(response)[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)


@pytest.mark.slow
def test_export_of_a_two_rank_zero3_checkpoint_gives_the_learners_logprobs(tmp_path, worker):
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    launch_two_ranks(run_dir, stage=3)
    r = subprocess.run(
        [sys.executable, "-m", "stare_tir.app.export", str(run_dir), "--step", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out = run_dir / "hf" / "step_000001"
    assert f"exported {out}" in r.stdout
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    probe = torch.load(run_dir / "probe.pt", weights_only=False)
    trajs = worker.make_trajs(4, seed=7, vocab=model.config.vocab_size)
    base = AutoModelForCausalLM.from_pretrained(str(ROOT / "stare_tir" / "assets" / "tiny-base"), dtype=torch.float32)
    moved = False
    for i, (row, traj) in enumerate(zip(probe["rows"], trajs)):
        assert row["response_ids"] == traj.response_ids
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        logp, ent = hf_logprobs_entropy(model, row["prompt_ids"], row["response_ids"])
        torch.testing.assert_close(logp[mask], probe["logps"][i][mask], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ent[mask], probe["ents"][i][mask], rtol=1e-4, atol=1e-5)
        base_logp, _ = hf_logprobs_entropy(base, row["prompt_ids"], row["response_ids"])
        moved |= not torch.allclose(base_logp[mask], logp[mask], atol=1e-4)
    assert moved, "the exported weights are the base model's: step 1 is not in them"

    # stare-eval takes the checkpoint directory itself: exported first (here again, from scratch).
    import shutil

    shutil.rmtree(out)
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "eval_aime.py"), f"model.path={run_dir / 'checkpoints' / 'step_000001'}",
         "eval.datasets=[arithmetic]", "eval.limit=2", "eval.n=1", f"out_dir={tmp_path / 'eval'}"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert (out / "config.json").is_file() and (tmp_path / "eval" / "summary.arithmetic.json").is_file()

    # A missing step is named with the ones there are.
    r = subprocess.run(
        [sys.executable, "-m", "stare_tir.app.export", str(run_dir), "--step", "5"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 2 and "no checkpoint of step 5; saved: step_000001" in r.stderr, r.stderr
