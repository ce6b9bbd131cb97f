"""scripts/gpu_check_sync.py (the weight-sync half of gpu_check.py): every part that needs no CUDA.

The 7B shapes, the push through the real SGLangBackend to the stand-in whose TP ranks open their
payloads in their own processes (CPU tensors travel by value there), the digests that make the
check bit-exact, the allow-list and the device rule in a rank process, and the fail-fast paths.
"""

from __future__ import annotations

import base64
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stare_tir.rollout.backends._http import request_sync
from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check_sync as sync  # noqa: E402


def test_the_7b_shape_is_qwen25_7b_and_layers_shrink_it():
    shapes = sync.state_dict_shapes(sync.QWEN25_7B)
    assert sync.numel(shapes) == 7_615_616_512  # Qwen2.5-7B's parameter count, lm_head untied
    names = dict(shapes)
    assert names["lm_head.weight"] == names["model.embed_tokens.weight"] == (152_064, 3584)
    assert names["model.layers.27.self_attn.k_proj.weight"] == (512, 3584)  # 4 KV heads x 128
    two = sync.state_dict_shapes(sync.QWEN25_7B, layers=2)
    assert len(two) == 1 + 2 * 12 + 2 and "model.layers.2.mlp.up_proj.weight" not in dict(two)


def test_digests_tell_a_flipped_bit_and_the_comparison_names_the_rank(standin):
    import torch

    _, cuda = sync.standin_module()
    t = sync.build_state_dict([("w", (8, 8))], "cpu")["w"]
    flipped = t.clone()
    flipped.view(torch.int16)[3, 3] ^= 1
    assert cuda.digest(t) == cuda.digest(t.clone()) and cuda.digest(t) != cuda.digest(flipped)
    expected = {"w": cuda.digest(t)}
    assert sync.compare([{"rank": 0, "digests": expected}], expected) == []
    bad = sync.compare([{"rank": 1, "digests": {"w": cuda.digest(flipped)}}], expected)
    assert bad == ["rank 1: 1 tensors differ, first w"]


@pytest.fixture
def ranked_server(standin, tiny_path):
    server = standin.StandinServer(str(tiny_path), tp_size=2, rank_processes=True, quirks={"safe_unpickle"}).start()
    yield server
    server.shutdown()


def test_a_push_reaches_each_tp_rank_process_bit_exact_twice(ranked_server):
    shapes = sync.state_dict_shapes(sync.TINY_SYNC, layers=1)
    sd = sync.build_state_dict(shapes, "cpu")
    be = SGLangBackend([ranked_server.url], SGLangConfig(weight_sync="tensor", bucket_mb=0.01))  # several buckets
    first = sync.push_and_check(be, ranked_server.url, sd, "1", "cpu")
    assert first["problems"] == [] and first["opened_on"] == ["cpu"] and first["gb_s"] > 0
    assert [r["rank"] for r in ranked_server.rank_reports] == [0, 1]  # each rank from its own process
    stale = {n: list(d) for n, d in ranked_server.rank_reports[0]["digests"].items()}
    for t in sd.values():
        t.neg_()
    second = sync.push_and_check(be, ranked_server.url, sd, "2", "cpu")
    assert second["problems"] == [] and ranked_server.weight_version == "2"
    # the ranks report what they keep: a rank left with the first push's bytes would fail here
    assert sync.compare(ranked_server.rank_reports, stale) != []


def test_a_rank_process_refuses_a_global_off_the_allow_list_and_the_server_stays_up(ranked_server):
    import os

    class Evil:
        def __reduce__(self):
            return os.getcwd, ()

    blob = base64.b64encode(pickle.dumps([("w", Evil())])).decode()
    request_sync("POST", ranked_server.url + "/begin_weight_update", {})
    with pytest.raises(Exception, match="Blocked unsafe global"):
        request_sync(
            "POST", ranked_server.url + "/update_weights_from_tensor", {"serialized_named_tensors": [blob] * 2}
        )
    assert request_sync("GET", ranked_server.url + "/model_info") is not None and ranked_server.fatal is None


def test_a_rank_process_given_an_unknown_gpu_uuid_takes_the_server_down(ranked_server):
    from torch.multiprocessing import reductions

    class Handle:  # what torch's reduce_tensor writes for a CUDA tensor, the device as a UUID
        def __reduce__(self):
            return reductions.rebuild_cuda_tensor, (None,) * 6 + (sync.ABSENT_GPU,) + (None,) * 6

    blob = base64.b64encode(pickle.dumps([("w", Handle())])).decode()
    _, cuda = sync.standin_module()
    assert cuda.payload_devices(base64.b64decode(blob)) == [sync.ABSENT_GPU]  # read without opening
    request_sync("POST", ranked_server.url + "/begin_weight_update", {})
    with pytest.raises(OSError):  # the connection closes without an answer
        request_sync(
            "POST", ranked_server.url + "/update_weights_from_tensor", {"serialized_named_tensors": [blob] * 2}
        )
    assert f"Invalid device_uuid={sync.ABSENT_GPU}" in ranked_server.fatal


def test_missing_wheels_are_named(monkeypatch):
    monkeypatch.setitem(sync.SYNC_DEPS, "no_such_module_here", "no-such-wheel")
    assert sync.missing_sync_deps() == ["no-such-wheel"]


def test_on_a_machine_without_a_gpu_the_script_says_so_in_one_line_fast():
    if Path("/dev/nvidia0").exists():
        pytest.skip("this machine has a GPU")
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--skip-learner"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode == 2 and time.perf_counter() - t0 < 10 and len(lines) == 1, lines
    assert "needs an NVIDIA GPU" in lines[0]


@pytest.mark.slow
def test_cpu_dry_run_of_the_sync_check_ends_with_its_result_line():
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu", "--tiny", "--skip-learner"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    out = res.stdout.strip().splitlines()
    fields = dict(kv.split("=", 1) for kv in out[-1].split()[1:])
    assert out[-1].startswith("RESULT ") and fields["sync_bit_exact"] == "pass" and fields["sync_tp"] == "2"
    assert fields["sync_refused"] == "skipped_no_cuda" and fields["sync_opened_on"] == "cpu"
    assert "what still needs real SGLang on GPUs" in res.stdout
    # weight_sync=distributed on gloo: one bucket bit-exact, then a refusal that ends the push promptly
    assert fields["gloo_bit_exact"] == "pass" and fields["gloo_refusal"] == "pass"
    assert float(fields["gloo_refusal_s"]) < 30
