"""Asynchronous training against the REAL SGLang server (0.5.23, CPU build): a push while a request
generates (pause with mode retract, load, flush, continue) and an eta=1 training run.

What the stand-in only mirrors is checked here on SGLang's own scheduler: a retracted request
keeps its tokens, is prefilled again under the new weights and goes on; its answer reports which
tokens each version sampled (`meta_info.weight_versions`), and the log-probs of each span are
those of its own weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import torch

from stare_tir.rollout.backends._http import request_sync
from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig

from .conftest import ROOT, TINY_BASE

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sglang_real")]


def _state(noise: float = 0.0) -> dict[str, torch.Tensor]:
    from stare_tir.rollout.backends._weights import iter_checkpoint_tensors

    gen = torch.Generator().manual_seed(0)
    return {
        n: t + noise * torch.randn(t.shape, generator=gen, dtype=t.dtype)
        for n, t in iter_checkpoint_tensors(str(TINY_BASE))
    }


def _logprobs(state: dict[str, torch.Tensor], ids: list[int], n_prompt: int) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(TINY_BASE)).eval()
    model.load_state_dict(state, strict=False)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, n_prompt - 1 : -1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(ids[n_prompt:])[:, None])[:, 0]


def test_a_push_mid_answer_retracts_the_request_and_resumes_it_on_the_new_weights(sglang_server):
    from transformers import AutoTokenizer

    url = sglang_server.url
    tok = AutoTokenizer.from_pretrained(str(TINY_BASE))
    prompt = tok("x = 12 * 7\nprint(x)\n", add_special_tokens=False)["input_ids"]
    base, new = _state(), _state(noise=0.05)
    be = SGLangBackend([url], SGLangConfig(weight_sync="tensor"))
    box: dict = {}
    try:
        be.update_weights(base.items(), version="10")
        be.allow_in_flight_updates(2)
        payload = {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 1500, "ignore_eos": True},
        }
        thread = threading.Thread(
            target=lambda: box.setdefault("out", request_sync("POST", url + "/generate", payload, timeout_s=600))
        )
        thread.start()
        time.sleep(1.0)  # well inside the answer (the tiny model takes seconds for 1500 tokens on CPU)
        assert thread.is_alive(), "the answer ended before the push: make it longer"
        be.update_weights(new.items(), version="11")
        thread.join(timeout=600)
    finally:
        be.update_weights(base.items(), version="default")  # as the server started
        be.close()
    meta = box["out"]["meta_info"]
    spans = [(s["start"], s["end"], s["version"]) for s in meta["weight_versions"]]
    ids = [p[1] for p in meta["output_token_logprobs"]]
    assert [v for _, _, v in spans] == ["10", "11"], spans
    k = spans[0][1]
    assert 0 < k < len(ids) == 1500 and spans[1] == (k, 1500, "11")
    got = torch.tensor([p[0] for p in meta["output_token_logprobs"]])
    old_lp, new_lp = _logprobs(base, prompt + ids, len(prompt)), _logprobs(new, prompt + ids, len(prompt))
    assert torch.allclose(got[:k], old_lp[:k], atol=2e-3)  # sampled by the old weights
    assert torch.allclose(got[k:], new_lp[k:], atol=2e-3)  # prefilled again and decoded by the new ones
    assert (got[k:] - old_lp[k:]).abs().max() > 0.01
    assert sglang_server.count_requests("/pause_generation") >= 1
    assert sglang_server.count_requests("/continue_generation") >= 1


def test_eta1_run_trains_one_version_behind_against_the_real_server(sglang_server, tmp_path):
    run_dir = tmp_path / "run"
    pauses = sglang_server.count_requests("/pause_generation")
    cmd = [
        sys.executable, str(ROOT / "scripts" / "train_tir.py"), f"trainer.run_dir={run_dir}", "model.path=tiny",
        "sft.enabled=false", "algo.name=grpo", "trainer.backend=sglang", f"rollout.sglang.urls={json.dumps([sglang_server.url])}",
        "rollout.sglang.weight_sync=tensor", "data.arithmetic_train_size=64", "data.arithmetic_eval_size=2",
        "trainer.prompts_per_step=4", "rollout.n_per_prompt=2", "rollout.max_total_tokens=48",
        "rollout.max_new_tokens_per_turn=24", "trainer.eval_every=0", "trainer.save_every=3", "trainer.steps=3",
        "learner.zero_stage=0", "trainer.max_staleness=1", "algo.off_policy.mode=tis",
    ]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-4000:]
    finally:  # the tiny base back on the server, as the other tests expect it
        be = SGLangBackend([sglang_server.url], SGLangConfig(weight_sync="tensor"))
        be.update_weights(_state().items(), version="default")
        be.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["async/lag_max"] for r in steps] == [0.0, 1.0, 1.0]
    assert all(r["dropped/stale"] == 0 and r["dropped/rollout_error"] == 0 for r in steps)
    assert all(r["weights/stale_answers"] == 0 for r in steps)  # in-flight answers are not "stale"
    assert sglang_server.count_requests("/pause_generation") - pauses == 3  # one per push while generating


def test_a_server_left_paused_by_a_killed_trainer_does_not_hold_the_next_run(sglang_server, tmp_path):
    """A trainer killed between /pause_generation and /continue_generation leaves the server
    paused; every /generate would wait forever. The next run continues it when it starts, and
    trains (the real server's continue is idempotent, so this is harmless when nothing was paused)."""
    request_sync("POST", sglang_server.url + "/pause_generation", {"mode": "retract"}, timeout_s=60)
    continues = sglang_server.count_requests("/continue_generation")
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable, str(ROOT / "scripts" / "train_tir.py"), f"trainer.run_dir={run_dir}", "model.path=tiny",
        "sft.enabled=false", "algo.name=grpo", "trainer.backend=sglang", f"rollout.sglang.urls={json.dumps([sglang_server.url])}",
        "rollout.sglang.weight_sync=tensor", "rollout.sglang.generate_timeout_s=300", "data.arithmetic_train_size=16",
        "data.arithmetic_eval_size=2", "trainer.prompts_per_step=2", "rollout.n_per_prompt=2", "rollout.max_total_tokens=32",
        "rollout.max_new_tokens_per_turn=16", "trainer.eval_every=0", "trainer.steps=1", "learner.zero_stage=0",
    ]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-4000:]
    finally:  # the tiny base back on the server, unpaused, as the other tests expect it
        request_sync("POST", sglang_server.url + "/continue_generation", {}, timeout_s=60)
        be = SGLangBackend([sglang_server.url], SGLangConfig(weight_sync="tensor"))
        be.update_weights(_state().items(), version="default")
        be.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert len(steps) == 1 and steps[0]["dropped/rollout_error"] == 0
    assert sglang_server.count_requests("/continue_generation") > continues
    assert "/continue_generation sent to" in (run_dir / "train.log").read_text()
