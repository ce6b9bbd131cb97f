"""GPU acceptance check for the learner and the HF rollout backend (one GPU, < 10 minutes).

Prepared for a GPU machine that has PyTorch (CUDA) and transformers but maybe not DeepSpeed or
the project's other dependencies, and no network. It measures, on a randomly initialised Qwen2
with Qwen2.5-0.5B's shape (24 layers, hidden 896, vocabulary 151,936; no download):

1. bf16 learner throughput and MFU at ZeRO-0, 1, 2 and 3: per step the recompute pass (chunked
   log-probs + entropy), STARE-O1 weights over the batch, and the clipped policy loss with
   backward and optimizer step, through `stare_tir.learner.Learner` (DeepSpeed). Tokens/s counts
   prompt + response tokens of the step. MFU = model FLOPs / time / peak: 6*N*T for the update
   plus 2*N*T for the recompute (N = non-embedding parameters + the lm_head matmul), plus the
   causal attention terms. Without DeepSpeed, ZeRO-0 is measured on plain torch instead (same
   module, loss and micro-batches; bf16 weights and AdamW) and ZeRO-3 is not run; the output says so.
2. HF-backend decode tokens/s (`stare_tir.rollout.backends.hf.HFBackend`, continuous batching,
   KV cache), stop strings off (the random model's ids have no tokenizer).
3. bf16 non-finite skip on the device at every DeepSpeed stage measured: a NaN advantage must
   leave the weights, the fp32 master weights (wherever the stage keeps them; at ZeRO-3 the torch
   optimizer holds none between steps) and the Adam state bit-identical, then a finite step must
   apply.
4. An untied 7B-like shape, scaled down (Qwen2.5-7B's proportions: head dim 128, 7 query heads
   per KV head, MLP 5.3x hidden, 152,064-token vocabulary, separate lm_head), at bf16 ZeRO-3 with
   gradient checkpointing: tokens/s, and the first step's loss and gradient norm must equal those
   of the same learner without checkpointing (recomputed activations are the same activations).

The last line is `RESULT key=value ...`. Exit status 1 if a correctness check failed.

Missing dependencies: DeepSpeed is not on PyPI as a wheel; build pure-Python wheels on a
machine with network and copy them next to the working tree (see `--wheel-dir`):

    pip wheel --no-deps --no-build-isolation -w wheels deepspeed==0.19.8
    pip download --no-deps --only-binary=:all: --python-version 3.X --platform manylinux2014_x86_64
                 -d wheels hjson py-cpuinfo msgpack einops    (one line; plus what the script reports)

Then `python scripts/gpu_check.py --wheel-dir wheels` installs them into wheels/site (no
network, `pip install --no-index --no-deps --target`) and imports from there. Without DeepSpeed the
script prints the exact commands for the wheels this machine lacks, then runs what it can.

CPU dry run (this machine, < 1 minute): `python scripts/gpu_check.py --device cpu --tiny`.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, without installing it

# Qwen2.5-0.5B's architecture (config.json of the public checkpoint); weights are random.
QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151_936,
    max_position_embeddings=32_768,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)
# Qwen2.5-7B's shape (28 layers, hidden 3584, 28 heads / 4 KV heads, MLP 18944, untied) scaled
# to 8 layers and hidden 1792 with the same head dim, GQA ratio, MLP ratio and vocabulary: ~1B
# parameters, the lm_head separate from the embedding as in the 7B model.
QWEN25_7B_SCALED = dict(
    hidden_size=1792,
    intermediate_size=9472,
    num_hidden_layers=8,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=152_064,
    max_position_embeddings=32_768,
    rope_theta=1_000_000.0,
    tie_word_embeddings=False,
    rms_norm_eps=1e-6,
)
TINY_UNTIED = dict(
    hidden_size=64,
    intermediate_size=176,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)
# Dense bf16 peak TFLOP/s by device name (vendor data sheets, SXM parts).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 70.0}
# What `import deepspeed` imports beyond torch and numpy (deepspeed 0.19.8's requirements plus
# pydantic's own; ninja only for compiling ops, which the learner does not use): module -> wheel.
DEEPSPEED_DEPS = {
    "hjson": "hjson",
    "cpuinfo": "py-cpuinfo",
    "msgpack": "msgpack",
    "einops": "einops",
    "packaging": "packaging",
    "psutil": "psutil",
    "tqdm": "tqdm",
    "pydantic": "pydantic",
    "pydantic_core": "pydantic-core",
    "annotated_types": "annotated-types",
    "typing_inspection": "typing-inspection",
    "typing_extensions": "typing-extensions",
}
DEEPSPEED_VERSION = "0.19.8"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="where to run; cpu is a dry run of the same code paths (default: cuda)",
    )
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="a 2-layer, 512-token-vocabulary model and small batches instead of the 0.5B shape "
        "(for the CPU dry run; figures are then meaningless)",
    )
    ap.add_argument("--seqs", type=int, default=None, help="sequences per learner step (default: 64; tiny: 4)")
    ap.add_argument("--prompt-len", type=int, default=None, help="prompt tokens per sequence (default: 256; tiny: 8)")
    ap.add_argument(
        "--response-len", type=int, default=None, help="response tokens per sequence (default: 768; tiny: 8)"
    )
    ap.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="learner.micro_batch_tokens: padded tokens per micro-batch (default: 16384; tiny: 32)",
    )
    ap.add_argument(
        "--steps", type=int, default=3, help="timed learner steps per ZeRO stage, after 1 warm-up (default: 3)"
    )
    ap.add_argument("--stages", default="0,1,2,3", help="comma-separated ZeRO stages to measure (default: 0,1,2,3)")
    ap.add_argument(
        "--decode-batch", type=int, default=None, help="concurrent HF-backend requests (default: 64; tiny: 4)"
    )
    ap.add_argument("--decode-tokens", type=int, default=None, help="new tokens per request (default: 256; tiny: 8)")
    ap.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="dense bf16 peak of the device for MFU (default: from the device name for "
        f"{', '.join(PEAK_TFLOPS)}; otherwise MFU is reported as nan)",
    )
    ap.add_argument(
        "--wheel-dir",
        type=Path,
        default=None,
        help="folder of wheels (deepspeed and its pure-Python requirements) to install into "
        "WHEEL_DIR/site without network when deepspeed is not importable",
    )
    ap.add_argument("--skip-sync", action="store_true", help="do not run the weight-sync check (gpu_check_sync.py)")
    ap.add_argument("--skip-learner", action="store_true", help="run only the weight-sync check")
    ap.add_argument(
        "--layers",
        type=int,
        default=None,
        help="weight sync: keep this many of the 7B shape's 28 layers (default: all)",
    )
    ap.add_argument("--tp", type=int, default=2, help="weight sync: TP ranks of the stand-in server (default: 2)")
    ap.add_argument(
        "--bucket-mb", type=float, default=512.0, help="weight sync: rollout.sglang.bucket_mb (default: 512)"
    )
    ap.add_argument("--skip-decode", action="store_true", help="do not measure the HF backend")
    ap.add_argument("--skip-nonfinite", action="store_true", help="do not run the non-finite skip checks")
    ap.add_argument(
        "--skip-untied",
        action="store_true",
        help="do not run the untied 7B-like shape with gradient checkpointing (ZeRO-3)",
    )
    a = ap.parse_args(argv)
    small = a.tiny
    for name, big, tiny in (
        ("seqs", 64, 4),
        ("prompt_len", 256, 8),
        ("response_len", 768, 8),
        ("micro_batch_tokens", 16384, 32),
        ("decode_batch", 64, 4),
        ("decode_tokens", 256, 8),
    ):
        if getattr(a, name) is None:
            setattr(a, name, tiny if small else big)
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')}={getattr(a, name)}: must be >= 1")
    if a.layers is not None and a.layers < 0 or a.tp < 1 or a.bucket_mb <= 0:
        ap.error(f"--layers={a.layers} --tp={a.tp} --bucket-mb={a.bucket_mb}: layers >= 0, tp >= 1, bucket-mb > 0")
    try:
        a.stages = [int(s) for s in a.stages.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--stages={a.stages!r}: comma-separated integers, e.g. 0,3")
    if not a.stages or any(s not in (0, 1, 2, 3) for s in a.stages):
        ap.error(f"--stages={a.stages!r}: each must be 0, 1, 2 or 3")
    return a


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder refused it, or a half-imported module
        return False


def use_wheel_dir(wheel_dir: Path | None) -> None:
    """Install the wheels of `wheel_dir` into wheel_dir/site (once, no network) and import from
    there, in this process and in the stand-in servers it starts."""
    if wheel_dir is None:
        return
    wheels = sorted(str(p) for p in wheel_dir.glob("*.whl"))
    site = wheel_dir / "site"
    if wheels and not site.exists():
        cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target", str(site), *wheels]
        subprocess.run(cmd, check=True)
    sys.path.insert(1, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    importlib.invalidate_caches()


def ensure_deepspeed() -> tuple[bool, str]:
    """Whether deepspeed and its requirements import here; returns (available, note)."""
    missing = [pkg for mod, pkg in DEEPSPEED_DEPS.items() if not importable(mod)]
    if not importable("deepspeed"):
        py = f"{sys.version_info.major}.{sys.version_info.minor}"
        bring = [f"pip wheel --no-deps --no-build-isolation -w wheels deepspeed=={DEEPSPEED_VERSION}"]
        if missing:  # binary ones (pydantic-core, msgpack, psutil) must match this Python and platform
            bring.append(
                f"pip download --no-deps --only-binary=:all: --python-version {py} "
                f"--platform manylinux2014_x86_64 -d wheels {' '.join(missing)}"
            )
        return False, (
            "deepspeed not importable; on a machine with network run: "
            + " && ".join(bring)
            + "; then pass --wheel-dir wheels. Meanwhile ZeRO-0 runs on plain torch; ZeRO-3 "
            "and the non-finite check are skipped"
        )
    if missing:
        return False, f"deepspeed is present but its requirements are not: {' '.join(missing)} (see --help)"
    return True, "deepspeed available"


def make_model_dir(shape: dict, root: Path, name: str = "qwen2-random") -> tuple[Path, int, int]:
    """Save a random bf16 Qwen2 of the given shape; returns (dir, non-embedding params, vocab)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**shape, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    path = root / name
    model.save_pretrained(path)
    # The embedding lookup costs no FLOPs, the lm_head matmul does: with tied weights the one
    # vocab x hidden matrix counts once, as the head; untied, the input embedding is left out.
    n_matmul = sum(p.numel() for p in model.parameters())
    if not cfg.tie_word_embeddings:
        n_matmul -= model.get_input_embeddings().weight.numel()
    del model
    return path, n_matmul, cfg.vocab_size


def step_flops(n_matmul: int, layers: int, hidden: int, seq_len: int, tokens: int) -> float:
    """Model FLOPs of one learner step: update (fwd + bwd) and recompute (fwd), causal attention."""
    attn = 2 * layers * hidden * seq_len  # QK^T and AV per token, forward, causal half of 2*2*L*d*S
    return (6 * n_matmul + 3 * attn) * tokens + (2 * n_matmul + attn) * tokens


def make_batch(n: int, prompt_len: int, response_len: int, vocab: int, seed: int) -> list[SimpleNamespace]:
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(2, vocab, (prompt_len + response_len,), generator=g).tolist()
        mask = [1] * response_len
        for j in range(response_len // 5, response_len // 5 + response_len // 10):  # a masked "observation"
            mask[j] = 0
        out.append(
            SimpleNamespace(
                prompt_ids=ids[:prompt_len],
                response_ids=ids[prompt_len:],
                loss_mask=mask,
                rollout_logprobs=[0.0] * response_len,
            )
        )
    return out


def stare_omega(surprisal, advantages, masks):
    """STARE-O1 weights over the whole batch (one rank), per trajectory."""
    import torch

    from stare_tir.algos.stare import stare_token_weights

    s = torch.cat([x[m.bool()] for x, m in zip(surprisal, masks)])
    a = torch.cat([torch.full((int(m.sum()),), float(adv)) for adv, m in zip(advantages, masks)])
    omega_flat, _ = stare_token_weights(s, a, top_p=0.1, w=1.1)
    out, k = [], 0
    for m in masks:
        v = torch.ones(m.numel())
        n = int(m.sum())
        v[m.bool()] = omega_flat[k : k + n]
        k += n
        out.append(v)
    return out


def learner_steps(learner, trajs, advantages, steps: int, sync) -> float:
    """1 warm-up + `steps` timed RL learner steps; returns seconds per step."""
    import torch

    from stare_tir.algos.policy_loss import Clip

    masks = [torch.tensor(t.loss_mask) for t in trajs]
    times = []
    for k in range(steps + 1):
        sync()
        t0 = time.perf_counter()
        old, _ = learner.compute_logprobs_entropy(trajs)
        omega = stare_omega([-lp for lp in old], advantages, masks)
        m = learner.train_step(trajs, advantages, omega, old, clip=Clip(low=0.2, high=0.28))
        sync()
        if k > 0:
            times.append(time.perf_counter() - t0)
        if m["step_skipped"]:
            raise RuntimeError(f"a finite learner step was skipped: {m}")
    return sum(times) / len(times)


def nonfinite_check(learner, trajs, advantages) -> str:
    """bf16 on the device: a NaN advantage leaves weights, fp32 masters and Adam state bit-identical."""
    import torch

    from stare_tir.learner.step_guard import master_weights

    def opt_state():
        out = master_weights(learner.engine.optimizer, learner.model.parameters())
        opt = learner._base_optimizer
        return out + [torch.as_tensor(v).clone() for st in opt.state.values() for _, v in sorted(st.items())]

    w0 = {k: v.clone() for k, v in learner.export_weights()}
    s0 = opt_state()
    bad = list(advantages)
    bad[len(bad) // 2] = float("nan")
    old, _ = learner.compute_logprobs_entropy(trajs)
    m = learner.train_step(trajs, bad, None, old)
    same_w = all(torch.equal(v, w0[k]) for k, v in learner.export_weights())
    same_s = all(torch.equal(x, y) for x, y in zip(s0, opt_state()))
    old, _ = learner.compute_logprobs_entropy(trajs)
    m2 = learner.train_step(trajs, advantages, None, old)
    finite = all(torch.isfinite(v).all() for _, v in learner.export_weights())
    ok = m["step_skipped"] == 1 and same_w and same_s and m2["step_skipped"] == 0 and finite
    print(
        f"non-finite skip (ZeRO-{learner.cfg.zero_stage}): skipped={m['step_skipped']:.0f} weights_identical={same_w} "
        f"optimizer_identical={same_s} next_step_applied={m2['step_skipped'] == 0} finite={finite}"
    )
    return "pass" if ok else "FAIL"


def untied_gradient_checkpointing(a: argparse.Namespace, root: Path, sync) -> dict[str, object]:
    """ZeRO-3 bf16 on the untied 7B-like shape: one step with and one without gradient
    checkpointing from the same weights must agree; then tokens/s with checkpointing."""

    from stare_tir.learner import Learner, LearnerConfig

    shape = TINY_UNTIED if a.tiny else QWEN25_7B_SCALED
    model_path, n_matmul, vocab = make_model_dir(shape, root, "qwen2-untied")
    trajs = make_batch(a.seqs, a.prompt_len, a.response_len, vocab, seed=1)
    advantages = [1.0 if i % 2 else -1.0 for i in range(a.seqs)]
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    first = {}
    for checkpointing in (False, True):
        cfg = LearnerConfig(
            zero_stage=3,
            dtype="bf16",
            lr=1e-6,
            micro_batch_tokens=a.micro_batch_tokens,
            gradient_checkpointing=checkpointing,
        )
        learner = Learner(model_path, cfg, tokenizer=tok)
        assert learner.model.get_output_embeddings().weight is not learner.model.get_input_embeddings().weight
        old, _ = learner.compute_logprobs_entropy(trajs)
        first[checkpointing] = learner.train_step(trajs, advantages, None, old)
        if checkpointing:
            sec = learner_steps(learner, trajs, advantages, a.steps, sync)
        del learner
        gc_collect(a.device)
    same = all(
        first[True][k] == first[False][k] or abs(first[True][k] - first[False][k]) <= 1e-2 * abs(first[False][k])
        for k in ("loss", "grad_norm")
    )
    tokens = a.seqs * (a.prompt_len + a.response_len)
    print(
        f"untied 7B-like ({n_matmul / 1e6:.0f}M matmul params) ZeRO-3 + gradient checkpointing: "
        f"{sec:.3f} s/step {tokens / sec:,.0f} tokens/s; first step loss {first[True]['loss']:.6f} vs "
        f"{first[False]['loss']:.6f}, grad norm {first[True]['grad_norm']:.6f} vs {first[False]['grad_norm']:.6f}"
    )
    return {"untied_gc_tok_s": round(tokens / sec, 1), "untied_gc_matches": "pass" if same else "FAIL"}


def gc_collect(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def decode_throughput(model_path: Path, device: str, batch: int, new_tokens: int, vocab: int) -> float:
    import asyncio

    import torch

    from stare_tir.rollout.backends.base import SamplingParams
    from stare_tir.rollout.backends.hf import HFBackend, HFBackendConfig

    tok = SimpleNamespace(eos_token_id=1, pad_token_id=0, decode=lambda ids, **kw: "")
    backend = HFBackend(str(model_path), tok, HFBackendConfig(device=device, dtype="bfloat16", max_batch_size=batch))
    try:
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(2, vocab, (64,), generator=g).tolist() for _ in range(batch)]
        sp = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
        asyncio.run(backend.generate_batch(prompts[:2], SamplingParams(max_new_tokens=4), []))  # warm-up
        t0 = time.perf_counter()
        gens = asyncio.run(backend.generate_batch(prompts, sp, []))
        dt = time.perf_counter() - t0
        return sum(len(g.token_ids) for g in gens) / dt
    finally:
        backend.close()


def has_nvidia_device() -> bool:
    """An NVIDIA device node or driver entry exists (checked before the seconds torch's import takes)."""
    return Path("/dev/nvidia0").exists() or any(Path("/proc/driver/nvidia/gpus").glob("*"))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    t_start = time.perf_counter()
    if a.device == "cuda" and not has_nvidia_device():
        print(
            "gpu_check needs an NVIDIA GPU (no /dev/nvidia0 here); for the CPU dry run: --device cpu --tiny",
            file=sys.stderr,
        )
        return 2
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check needs CUDA: torch.cuda.is_available() is False (a CPU build of torch, or no driver); "
            "for the CPU dry run: --device cpu --tiny",
            file=sys.stderr,
        )
        return 2
    use_wheel_dir(a.wheel_dir)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpu_check_sync

    missing = [] if a.skip_sync else gpu_check_sync.missing_sync_deps()
    if missing:  # before minutes of learner steps: the loan is short
        py = f"{sys.version_info.major}.{sys.version_info.minor}"
        print(
            f"gpu_check: the weight-sync check needs {' '.join(missing)}; on a machine with network: pip download "
            f"--no-deps --only-binary=:all: --python-version {py} --platform manylinux2014_x86_64 -d wheels "
            f"{' '.join(missing)}, then pass --wheel-dir wheels (or --skip-sync)",
            file=sys.stderr,
        )
        return 2
    have_ds, ds_note = ensure_deepspeed()
    name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    peak = a.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), float("nan"))
    print(f"device: {name}  torch {torch.__version__}  peak bf16 {peak} TFLOP/s  {ds_note}")
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    results: dict[str, object] = {"device": name.replace(" ", "_"), "deepspeed": int(have_ds)}
    failed = False
    if not a.skip_sync:
        synced = gpu_check_sync.run_sync_check(a.device, a.tiny, a.layers, a.tp, a.bucket_mb)
        results.update(synced)
        failed |= any(str(v).startswith("fail") for v in synced.values())
        gpu_check_sync.print_report()
    if a.skip_learner:
        return finish(results, t_start, failed)

    with tempfile.TemporaryDirectory() as tmp:
        shape = TINY if a.tiny else QWEN25_05B
        model_path, n_matmul, vocab = make_model_dir(shape, Path(tmp))
        trajs = make_batch(a.seqs, a.prompt_len, a.response_len, vocab, seed=0)
        advantages = [1.0 if i % 2 else -1.0 for i in range(a.seqs)]
        tokens = a.seqs * (a.prompt_len + a.response_len)
        flops = step_flops(
            n_matmul, shape["num_hidden_layers"], shape["hidden_size"], a.prompt_len + a.response_len, tokens
        )
        print(f"model: {n_matmul / 1e6:.0f}M matmul params, {tokens} tokens/step, {flops / 1e12:.2f} TFLOP/step")
        for stage in a.stages:
            if not have_ds and stage != 0:
                print(f"ZeRO-{stage}: skipped (no deepspeed)")
                results[f"zero{stage}_tok_s"] = "skipped"
                continue
            if have_ds:
                from stare_tir.learner import Learner, LearnerConfig

                tok = SimpleNamespace(pad_token_id=0, eos_token_id=1)
                cfg = LearnerConfig(zero_stage=stage, dtype="bf16", lr=1e-6, micro_batch_tokens=a.micro_batch_tokens)
                try:
                    learner = Learner(model_path, cfg, tokenizer=tok)
                except ValueError as e:  # ZeRO-0: this DeepSpeed version accumulates bf16 in bf16 only
                    print(f"ZeRO-{stage}: {e}; measuring with grad_accum_dtype=bf16")
                    cfg.grad_accum_dtype = "bf16"
                    learner = Learner(model_path, cfg, tokenizer=tok)
                label = f"ZeRO-{stage} (DeepSpeed, grad accumulation {cfg.grad_accum_dtype})"
            else:
                from gpu_check_plain import PlainTorchLearner

                learner = PlainTorchLearner(model_path, a.device, a.micro_batch_tokens)
                label = "ZeRO-0 (plain torch, no DeepSpeed)"
            sec = learner_steps(learner, trajs, advantages, a.steps, sync)
            tok_s, mfu = tokens / sec, flops / sec / (peak * 1e12)
            mem = torch.cuda.max_memory_allocated() / 2**30 if a.device == "cuda" else float("nan")
            print(f"{label}: {sec:.3f} s/step  {tok_s:,.0f} tokens/s  MFU {mfu:.3f}  peak mem {mem:.1f} GiB")
            results[f"zero{stage}_tok_s"] = round(tok_s, 1)
            results[f"zero{stage}_mfu"] = round(mfu, 4)
            if have_ds and not a.skip_nonfinite:
                checked = nonfinite_check(learner, trajs[: max(2, a.seqs // 4)], advantages[: max(2, a.seqs // 4)])
                results[f"nonfinite_zero{stage}"] = checked
                failed |= checked != "pass"
            del learner
            gc_collect(a.device)
        checks = [v for k, v in results.items() if k.startswith("nonfinite_zero")]
        if checks:
            results["nonfinite_skip"] = "pass" if all(v == "pass" for v in checks) else "FAIL"
        else:
            results["nonfinite_skip"] = "not_run" + ("" if have_ds else "_no_deepspeed")
        if have_ds and not a.skip_untied:
            results.update(untied_gradient_checkpointing(a, Path(tmp), sync))
            failed |= results["untied_gc_matches"] != "pass"
        if not a.skip_decode:
            dec = decode_throughput(model_path, a.device, a.decode_batch, a.decode_tokens, vocab)
            print(f"HF backend decode: {dec:,.0f} new tokens/s ({a.decode_batch} concurrent requests)")
            results["decode_tok_s"] = round(dec, 1)
    return finish(results, t_start, failed)


def finish(results: dict[str, object], t_start: float, failed: bool) -> int:
    """The RESULT line; exit status 1 if a correctness check failed."""
    results["wall_s"] = round(time.perf_counter() - t_start, 1)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in results.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
