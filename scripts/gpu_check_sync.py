"""The weight-sync half of scripts/gpu_check.py: CUDA-IPC tensor sync of a 7B-shaped state dict.

What runs: a random, untied bf16 state dict with Qwen2.5-7B's shapes (hidden 3584, MLP 18944,
28 layers, vocabulary 152,064, 28 query / 4 KV heads of dim 128: 7.6 B parameters, 15.2 GB;
`--layers N` keeps N layers) is pushed twice through the real `SGLangBackend` (weight_sync=tensor)
to the SGLang stand-in (tests/rollout/sglang_standin.py) started with `--rank-processes`: each TP
rank opens its own payload in its own process under SGLang 0.5.23's receiving rules
(python/sglang/srt/utils/patch_torch.py `monkey_patch_torch_reductions`: the handle's device is a
GPU UUID looked up among the GPUs the rank sees, an unknown one raising in the scheduler's weight
updater; the pickle read through an allow-list as managers/tp_worker.py `deserialize_own_rank`
does), copies the tensors into weights it keeps (as model_runner.py `update_weights_from_tensor`
loads them into the parameters) and reports a digest of each. Checked: the digests equal the
sender's after each push (the second push negates every tensor, so stale bytes cannot pass),
the sender's CUDA memory is back to its baseline after each push, the receivers' memory does not
grow from the first push to the second; measured: GB/s of each push. Then the invisible-device
refusal: a server launched with CUDA_VISIBLE_DEVICES naming another GPU is refused with one line
before any handle is sent, and a handle sent anyway takes that server down (the crash the refusal
prevents). Then weight_sync=distributed: a ~1 GB bucket broadcast bit-exact from the project's
update group to a stand-in receiver and a refused push timed (NCCL with a second GPU; one GPU
skips it, see `distributed_check`; gloo on CPU).

On a CPU machine (`--device cpu --tiny`, and the tests) the same push runs with CPU tensors, which
travel by value: the rank processes, the allow-list, the digests and the report run; the CUDA
parts (handles, memory, refusal) report `skipped_no_cuda`.
"""

from __future__ import annotations

import base64
import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STANDIN_DIR = ROOT / "tests" / "rollout"

# Qwen2.5-7B (config.json of the public checkpoint): the shapes of its state dict, untied.
QWEN25_7B = dict(hidden=3584, intermediate=18944, layers=28, vocab=152_064, q_heads=28, kv_heads=4, head_dim=128)
TINY_SYNC = dict(hidden=64, intermediate=176, layers=2, vocab=512, q_heads=4, kv_heads=2, head_dim=16)
# What `stare_tir.rollout.backends.sglang` imports beyond torch and transformers: module -> wheel.
# aiohttp and its helpers have pure-Python fallbacks (AIOHTTP_NO_EXTENSIONS=1 and the like) when
# a wheel for this Python is not at hand.
SYNC_DEPS = {
    "loguru": "loguru",
    "aiohttp": "aiohttp",
    "multidict": "multidict",
    "yarl": "yarl",
    "frozenlist": "frozenlist",
    "propcache": "propcache",
    "aiosignal": "aiosignal",
    "aiohappyeyeballs": "aiohappyeyeballs",
    "attr": "attrs",
    "idna": "idna",
}
# A GPU UUID no machine has: a server launched seeing only it cannot see the trainer's GPU.
ABSENT_GPU = "GPU-00000000-0000-0000-0000-000000000000"


def missing_sync_deps() -> list[str]:
    """Wheels this machine lacks for the SGLang backend (empty: it imports)."""
    missing = []
    for module, wheel in SYNC_DEPS.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(wheel)
    return missing


def state_dict_shapes(shape: dict, layers: int | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of an untied Qwen2 state dict as SGLang's Qwen2 loader reads it
    (`model.layers.N.self_attn.q_proj.weight`, ..., a separate `lm_head.weight`)."""
    h, inter, v = shape["hidden"], shape["intermediate"], shape["vocab"]
    q, kv = shape["q_heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (v, h))]
    for i in range(shape["layers"] if layers is None else layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.q_proj.bias", (q,)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
        ]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]


def numel(shapes: list[tuple[str, tuple[int, ...]]]) -> int:
    total = 0
    for _, dims in shapes:
        n = 1
        for d in dims:
            n *= d
        total += n
    return total


def build_state_dict(shapes: list[tuple[str, tuple[int, ...]]], device: str, seed: int = 0) -> dict[str, Any]:
    """Random bf16 tensors of those shapes on `device` (made there: no host copy of 15 GB)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    return {
        name: torch.randn(dims, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
        for name, dims in shapes
    }


def standin_module() -> Any:
    """The stand-in's helper modules (tests/rollout/), importable from the script."""
    if str(STANDIN_DIR) not in sys.path:
        sys.path.insert(0, str(STANDIN_DIR))
    import sglang_standin
    import sglang_standin_cuda

    return sglang_standin, sglang_standin_cuda


def compare(reports: list[dict], expected: dict[str, list[int]]) -> list[str]:
    """What differs between each rank's digests and the sender's (empty: bit-exact on every rank)."""
    problems = []
    for report in reports:
        got = report.get("digests", {})
        if set(got) != set(expected):
            problems.append(f"rank {report.get('rank')}: {len(got)} tensors received, {len(expected)} sent")
            continue
        bad = [n for n in expected if list(got[n]) != list(expected[n])]
        if bad:
            problems.append(f"rank {report.get('rank')}: {len(bad)} tensors differ, first {bad[0]}")
    return problems


def allocated(device: str) -> int:
    import torch

    if device != "cuda":
        return 0
    torch.cuda.synchronize()
    torch.cuda.ipc_collect()  # handles the receivers closed are released on this side here
    return torch.cuda.memory_allocated()


def push_and_check(backend: Any, standin_url: str, sd: dict, version: str, device: str) -> dict[str, Any]:
    """One push through the backend; the receivers' reports checked against the sender's digests."""
    from stare_tir.rollout.backends._http import request_sync

    _, cuda_helpers = standin_module()
    expected = {name: cuda_helpers.digest(t) for name, t in sd.items()}
    before = allocated(device)
    t0 = time.perf_counter()
    backend.update_weights(sd.items(), version=version)
    took = time.perf_counter() - t0
    after = allocated(device)
    reports = request_sync("GET", standin_url + "/standin_stats", timeout_s=60)["rank_reports"]
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    return {
        "problems": compare(reports, expected),
        "seconds": took,
        "gb_s": nbytes / took / 1e9,
        "sender_growth": after - before,
        "receiver_allocated": [r.get("allocated", 0) for r in reports],
        "opened_on": sorted({d for r in reports for d in r.get("opened_on", [])}),
    }


def invisible_device_refusal(model_dir: Path, device: str) -> dict[str, Any]:
    """A server that cannot see the trainer's GPU: refused before any handle; a handle sent anyway
    kills it (patch_torch.py's raise in the scheduler)."""
    import torch

    from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig, serialize_named_tensors

    if device != "cuda":
        return {"refused": "skipped_no_cuda", "crash_without_check": "skipped_no_cuda"}
    standin, _ = standin_module()
    proc, url = standin.launch_standin(
        str(model_dir), extra_args=["--rank-processes"], env={"CUDA_VISIBLE_DEVICES": ABSENT_GPU}
    )
    out: dict[str, Any] = {}
    try:
        backend = SGLangBackend([url], SGLangConfig(weight_sync="tensor"))
        small = {"lm_head.weight": torch.ones(4, 4, dtype=torch.bfloat16, device="cuda")}
        t0 = time.perf_counter()
        try:
            backend.update_weights(small.items(), version="1")
            out["refused"] = "fail(pushed)"
        except ValueError as exc:
            ok = "cannot see the trainer's GPU" in str(exc) and proc.poll() is None
            out["refused"] = "pass" if ok else f"fail({exc})"
        out["refusal_s"] = round(time.perf_counter() - t0, 3)
        from stare_tir.rollout.backends._http import request_sync

        blob = serialize_named_tensors(list(small.items()))
        body = {"serialized_named_tensors": [blob], "load_format": None, "flush_cache": False}
        try:
            request_sync("POST", url + "/begin_weight_update", {}, timeout_s=60)  # 0.5.23's session
            request_sync("POST", url + "/update_weights_from_tensor", body, timeout_s=60)
        except Exception:  # noqa: BLE001 - the connection closes without an answer: the server died
            pass
        proc.wait(timeout=30)
        out["crash_without_check"] = "pass" if proc.returncode not in (None, 0) else "fail(still serving)"
        del blob
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    return out


def run_sync_check(device: str, tiny: bool, layers: int | None, tp: int, bucket_mb: float) -> dict[str, Any]:
    """The whole weight-sync check; returns its RESULT fields (prefixed `sync_`)."""
    from stare_tir.model import ensure_tiny_checkpoint
    from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig

    shapes = state_dict_shapes(TINY_SYNC if tiny else QWEN25_7B, layers)
    n = numel(shapes)
    print(f"weight sync: {len(shapes)} tensors, {n / 1e9:.2f} B parameters, {2 * n / 1e9:.2f} GB bf16, tp {tp}")
    standin, _ = standin_module()
    results: dict[str, Any] = {"sync_params_m": round(n / 1e6, 1), "sync_tp": tp}
    with tempfile.TemporaryDirectory(prefix="gpu-check-sync-") as tmp:
        model_dir = ensure_tiny_checkpoint(Path(tmp) / "standin-model")  # the stand-in's own model
        proc, url = standin.launch_standin(
            str(model_dir), extra_args=["--rank-processes", "--tp-size", str(tp)], timeout_s=300
        )
        try:
            backend = SGLangBackend([url], SGLangConfig(weight_sync="tensor", bucket_mb=bucket_mb))
            sd = build_state_dict(shapes, device)
            first = push_and_check(backend, url, sd, "1", device)
            for t in sd.values():
                t.neg_()  # every tensor changes: a rank that kept the first push's bytes fails
            second = push_and_check(backend, url, sd, "2", device)
            del sd
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        problems = first["problems"] + second["problems"]
        results["sync_bit_exact"] = "pass" if not problems else "fail"
        for p in problems:
            print(f"weight sync: {p}")
        results["sync_gb_s_1"] = round(first["gb_s"], 2)
        results["sync_gb_s_2"] = round(second["gb_s"], 2)
        results["sync_opened_on"] = ",".join(second["opened_on"]) or "none"
        if device == "cuda":
            growth = max(first["sender_growth"], second["sender_growth"])
            results["sync_sender_mem_back"] = "pass" if growth == 0 else f"fail(+{growth})"
            same = first["receiver_allocated"] == second["receiver_allocated"]
            results["sync_receiver_mem_stable"] = "pass" if same else "fail"
        else:
            results["sync_sender_mem_back"] = results["sync_receiver_mem_stable"] = "skipped_no_cuda"
        refusal = invisible_device_refusal(model_dir, device)
        results.update({f"sync_{k}": v for k, v in refusal.items()})
        results.update(distributed_check(model_dir, device, TINY_SYNC if tiny else QWEN25_7B))
    return results


PROVES = [
    "the project's SGLangBackend serializes a 7B-shaped untied bf16 state dict into one CUDA-IPC "
    "payload per TP rank, with the GPU named by UUID, in buckets of rollout.sglang.bucket_mb",
    "each payload opens in its own process under SGLang 0.5.23's rules (UUID looked up among the "
    "visible GPUs, pickle read through an allow-list) and the bytes arrive bit-exact, twice",
    "the sender's CUDA memory is back to its baseline after each push (no handle kept alive)",
    "a server that cannot see the trainer's GPU is refused with one line before any handle is sent, "
    "and the same handle sent anyway kills it (what the refusal prevents)",
    "weight_sync=distributed (NCCL with a second GPU, else gloo; NCCL refuses two ranks on one GPU): "
    "a ~1 GB bucket arrives bit-exact and a refused push ends the trainer's side within the time shown",
]
NEEDS_REAL_SGLANG = [
    "SGLang's own loader: sharding each tensor for its TP rank, the fused qkv/gate_up copies, "
    "weights_only checks in SafeUnpickler for every global a CUDA handle names",
    "the scheduler's pause/retract/continue around a push and the flush after it, on GPUs",
    "NCCL weight sync against SGLang's own group (init_custom_process_group) on its TP ranks, and, "
    "on a one-GPU machine, NCCL at all (skipped_one_gpu: a communicator cannot hold two ranks of one GPU)",
    "the memory saver (release/resume of weights and KV cache) in a colocated layout",
    "TP > 1 colocated with the trainer: each rank's handle on its own GPU (today every payload names "
    "the pushing rank's GPU)",
]


def print_report() -> None:
    print("weight sync: what this proves")
    for line in PROVES:
        print(f"  - {line}")
    print("weight sync: what still needs real SGLang on GPUs")
    for line in NEEDS_REAL_SGLANG:
        print(f"  - {line}")


def payload_b64_devices(payload: str) -> list[str]:
    """The devices a base64 payload's CUDA handles name (see sglang_standin_cuda.payload_devices)."""
    _, cuda_helpers = standin_module()
    return cuda_helpers.payload_devices(base64.b64decode(payload))


def distributed_check(model_dir: Path, device: str, shape: dict, bucket_mb: float = 1024.0) -> dict[str, Any]:
    """weight_sync=distributed: one bucket of ~1 GB (two of the shape's layers) broadcast from the
    project's update group to a stand-in receiver, bit-exact; then a refused push, timed.

    NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected", a check since
    NCCL 2.5, and its topology search would not work without it: NVIDIA/nccl issue 418), so with
    CUDA the receiver runs on a second GPU and one GPU skips this part; on CPU it runs on gloo.
    SGLang builds its side as utils/common.py `init_custom_process_group` (from
    model_runner_components/weight_updater.py `init_weights_update_group`); the stand-in uses the
    project's `init_weight_update_group`, which builds it the same way (see _weights.py)."""
    import torch

    from stare_tir.rollout.backends._http import request_sync
    from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig

    if device == "cuda" and torch.cuda.device_count() < 2:
        return {"nccl": "skipped_one_gpu"}
    standin, cuda_helpers = standin_module()
    backend_name = "nccl" if device == "cuda" else "gloo"
    env = {}
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(torch.cuda.get_device_properties(1).uuid)
        env["CUDA_VISIBLE_DEVICES"] = "GPU-" + env["CUDA_VISIBLE_DEVICES"].removeprefix("GPU-")
    proc, url = standin.launch_standin(str(model_dir), extra_args=["--rank-processes"], env=env, timeout_s=300)
    key = "nccl" if device == "cuda" else "gloo"
    out: dict[str, Any] = {}
    try:
        cfg = SGLangConfig(weight_sync="distributed", dist_backend=backend_name, bucket_mb=bucket_mb, timeout_s=120)
        backend = SGLangBackend([url], cfg)
        shapes = [(n, s) for n, s in state_dict_shapes(shape, 2) if ".layers." in n]
        sd = build_state_dict(shapes, device, seed=1)
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        expected = {n: cuda_helpers.digest(t) for n, t in sd.items()}
        t0 = time.perf_counter()
        backend.update_weights(sd.items(), version="1")
        took = time.perf_counter() - t0
        reports = request_sync("GET", url + "/standin_stats", timeout_s=60)["rank_reports"]
        out[f"{key}_bucket_gb"] = round(nbytes / 1e9, 2)
        out[f"{key}_bit_exact"] = "pass" if not compare(reports, expected) else "fail"
        out[f"{key}_gb_s"] = round(nbytes / took / 1e9, 2)
        request_sync("POST", url + "/standin_fault", {"refuse_update": 1}, timeout_s=60)
        t0 = time.perf_counter()
        try:
            backend.update_weights(sd.items(), version="2")
            out[f"{key}_refusal"] = "fail(accepted)"
        except Exception as exc:  # noqa: BLE001 - the refusal is what is checked
            out[f"{key}_refusal"] = "pass" if "refused" in str(exc) else f"fail({type(exc).__name__})"
        out[f"{key}_refusal_s"] = round(time.perf_counter() - t0, 2)
        del sd
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return out
