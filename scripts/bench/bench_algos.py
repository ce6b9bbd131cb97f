"""Benchmark the algorithmic core, side by side in one run (CPU).

1. STARE weights + clipped loss vs the plain GRPO loss on 1M response tokens, forward+backward
   -> stare_loss_ratio (target <= 1.3); also for C2 and on one thread (*_1thread).
2. A whole learner micro-step on a tiny random Qwen2ForCausalLM: forward, chunked log-probs,
   loss, backward; with STARE weights vs without -> stare_step_ratio (target <= 1.03).
3. Chunked log-probs + entropy (forward+backward) vs the naive full-logits path at the Qwen2.5
   vocabulary (151,665): peak memory, each path in a fresh subprocess (peak RSS minus the RSS
   before the computation) -> logprob_mem_ratio (target <= 0.25), plus the largest differences.
4. Each baseline token method (its selection over the batch, then the loss with its effect, forward
   + backward) vs the plain GRPO loss on the same 1M tokens -> <method>_loss_ratio, one thread.

Timings are medians over interleaved repeats; a ratio is the median over repeats of the two
times measured in the same round, so drifting machine load hits both sides alike. The load
average is printed: on a busy machine every figure is noisier.
The last line is `RESULT key=value ...`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

import torch

from stare_tir.algos.logprobs import logprobs_and_entropy
from stare_tir.algos.policy_loss import LossInputs, clip_loss
from stare_tir.algos.stare import StareController, stare_token_weights
from stare_tir.algos.token_methods import TOKEN_METHODS, RunMethods, TokenInputs

QWEN25_VOCAB = 151_665


def interleaved_medians(
    fns: dict[str, Callable[[], None]], repeats: int, warmup: int = 2
) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per function, and the median over repeats of each function's time divided
    by the first function's time in the same round. Functions run round-robin (order reversed
    every other round), so load that drifts during the run hits all of them alike, and the
    paired ratio cancels what changes from one round to the next."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(repeats):
        order = list(fns) if i % 2 == 0 else list(reversed(fns))  # no fixed position bias
        for k in order:
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t0)
    base = next(iter(fns))
    medians = {k: statistics.median(v) for k, v in times.items()}
    ratios = {k: statistics.median(a / b for a, b in zip(v, times[base])) for k, v in times.items()}
    return medians, ratios


def bench_loss(n_tokens: int, repeats: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    t = 4096
    b = n_tokens // t
    logprobs = (-torch.rand(b, t, generator=g) * 3).requires_grad_()  # [B, T]
    old = logprobs.detach() + 0.05 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, 1, generator=g).expand(b, t).contiguous()  # per-sequence advantage
    mask = torch.ones(b, t)

    def plain() -> None:
        logprobs.grad = None
        loss, _ = clip_loss(LossInputs(logprobs, old, adv, mask))
        loss.backward()

    def stare(variant: str) -> Callable[[], None]:
        def run() -> None:
            logprobs.grad = None
            omega, _ = stare_token_weights(-old, adv, top_p=0.1, w=1.1, m=0.9, variant=variant)
            loss, _ = clip_loss(LossInputs(logprobs, old, adv, mask, token_weights=omega))
            loss.backward()

        return run

    def weights_only() -> None:
        stare_token_weights(-old, adv, top_p=0.1, w=1.1, m=0.9)

    med, ratio = interleaved_medians(
        {"grpo": plain, "stare_o1": stare("O1"), "stare_c2": stare("C2"), "weights": weights_only}, repeats
    )
    return {
        "stare_loss_ratio": ratio["stare_o1"],
        "stare_c2_loss_ratio": ratio["stare_c2"],
        "grpo_loss_ms": med["grpo"] * 1e3,
        "stare_loss_ms": med["stare_o1"] * 1e3,
        "stare_weights_ms": med["weights"] * 1e3,
        "loss_tokens": float(b * t),
    }


def bench_methods(n_tokens: int, repeats: int) -> dict[str, float]:
    """Every registered token method as the trainer runs it: the method on the flat loss tokens, its
    effect placed on the [B, T] batch (shaped advantages, weights, narrowed mask, KL coefficients),
    the loss forward + backward. Against the plain GRPO loss, interleaved in the same run."""
    from stare_tir.algos.policy_loss import POLICY_LOSSES

    g = torch.Generator().manual_seed(0)
    t = 4096
    b = n_tokens // t
    logprobs = (-torch.rand(b, t, generator=g) * 3).requires_grad_()  # [B, T]
    old = logprobs.detach() + 0.05 * torch.randn(b, t, generator=g)
    entropy = torch.rand(b, t, generator=g) * 2
    adv = (torch.randn(b, 1, generator=g) * 3).expand(b, t).contiguous()  # spread: Clip-Cov has candidates
    mask = torch.ones(b, t)
    m = mask.bool()

    def plain() -> None:
        logprobs.grad = None
        loss, _ = clip_loss(LossInputs(logprobs, old, adv, mask))
        loss.backward()

    def method(name: str) -> Callable[[], None]:
        settings = TOKEN_METHODS.config_of(name)()  # the method's defaults
        fn = RunMethods().get(name, settings)  # a stateful method: a fresh instance
        loss_fn = POLICY_LOSSES.get("kl_cov" if name == "kl_cov" else "clip")

        def run() -> None:
            logprobs.grad = None
            e = fn(TokenInputs(old[m], entropy[m], adv[m], torch.Generator().manual_seed(1)), settings)
            a, msk, w, terms = adv, mask, None, {}
            if e.advantages is not None:
                a = adv.clone()
                a[m] = e.advantages
            if e.keep is not None:
                msk = mask.clone()
                msk[m] = e.keep.to(mask.dtype)
            if e.weights is not None:
                w = torch.ones_like(adv)
                w[m] = e.weights
            for key, term in (e.terms or {}).items():
                terms[key] = torch.zeros_like(adv)
                terms[key][m] = term
            loss, _ = loss_fn(LossInputs(logprobs, old, a, msk, token_weights=w, terms=terms))
            loss.backward()

        return run

    names = sorted(n for n in TOKEN_METHODS.names() if n != "stare")  # STARE's cost: bench_loss
    fns = {"grpo": plain, **{name: method(name) for name in names}}
    med, ratio = interleaved_medians(fns, repeats)
    out = {f"{name}_loss_ratio": ratio[name] for name in names}
    out.update({f"methods_{name}_ms": med[name] * 1e3 for name in fns})
    return out


def bench_step(repeats: int) -> dict[str, float]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(cfg)
    b, t = 8, 256
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (b, t), generator=g)  # [B, T]
    mask = (torch.rand(b, t - 1, generator=g) < 0.8).float()  # response tokens (tool output masked)
    adv = torch.randn(b, 1, generator=g).expand(b, t - 1) * mask
    with torch.no_grad():  # the recompute pass: old log-probs and entropy
        hid = model.model(input_ids=ids).last_hidden_state[:, :-1]
        old, ent = logprobs_and_entropy(hid, model.lm_head.weight, ids[:, 1:])
    ctrl = StareController(target_entropy=100.0)  # random model: high entropy; keep the gate on
    n_tok = float(mask.sum())
    batch_entropy = float((ent * mask).sum() / n_tok)  # logged by the recompute pass anyway

    def step(use_stare: bool) -> Callable[[], None]:
        def run() -> None:
            model.zero_grad(set_to_none=True)
            omega = None
            if use_stare and ctrl.update(batch_entropy):
                omega, _ = stare_token_weights(-old, adv, mask=mask, w=ctrl.w, m=ctrl.m)
            hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]  # [B, T-1, H]
            logp, _ = logprobs_and_entropy(hidden, model.lm_head.weight, ids[:, 1:], with_entropy=False)
            loss, _ = clip_loss(LossInputs(logp, old, adv, mask, token_weights=omega, global_tokens=n_tok))
            loss.backward()

        return run

    med, ratio = interleaved_medians({"grpo": step(False), "stare": step(True)}, repeats)
    assert ctrl.gate_on
    return {
        "stare_step_ratio": ratio["stare"],
        "grpo_step_ms": med["grpo"] * 1e3,
        "stare_step_ms": med["stare"] * 1e3,
        "step_tokens": float(b * (t - 1)),
    }


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _mem_inputs(n: int, hdim: int, vocab: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, hdim, generator=g)  # [N, H]
    weight = torch.randn(vocab, hdim, generator=g).mul_(0.5)  # [V, H]; in place: no temporary
    targets = torch.randint(0, vocab, (n,), generator=g)
    g_out = torch.randn(n, generator=g)  # upstream gradient of the log-probs
    return hidden, weight, targets, g_out


def mem_child(path: str, n: int, hdim: int, vocab: int, chunk: int, out: str) -> None:
    """Run one log-prob path (forward + backward) and report its peak memory above the start."""
    hidden, weight, targets, g_out = _mem_inputs(n, hdim, vocab)
    hidden.requires_grad_()
    weight.requires_grad_()
    before = _rss_bytes()
    t0 = time.perf_counter()
    if path == "chunked":
        logp, ent = logprobs_and_entropy(hidden, weight, targets, chunk_size=chunk)
    else:
        logq = torch.log_softmax(hidden @ weight.t(), dim=-1)  # [N, V] float32
        logp = logq.gather(1, targets[:, None]).squeeze(1)
        ent = -(logq.exp() * logq).sum(-1).detach()
    (logp * g_out).sum().backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    torch.save(
        {
            "logp": logp.detach(),
            "ent": ent,
            "grad_h": hidden.grad,
            "grad_w": weight.grad,
            "peak_delta": peak - before,
            "seconds": seconds,
        },
        out,
    )


def _float64_reference(n: int, hdim: int, vocab: int, rows: int = 256) -> dict[str, torch.Tensor]:
    """Plain autograd in float64, a block of rows at a time (independent of the code under test)."""
    hidden, weight, targets, g_out = (x.double() if x.is_floating_point() else x for x in _mem_inputs(n, hdim, vocab))
    weight.requires_grad_()
    logp, ent, grad_h = [], [], []
    for s in range(0, n, rows):
        h = hidden[s : s + rows].clone().requires_grad_()
        logq = torch.log_softmax(h @ weight.t(), dim=-1)  # [rows, V] float64
        lp = logq.gather(1, targets[s : s + rows, None]).squeeze(1)
        ent.append(-(logq.exp() * logq).sum(-1).detach())
        (lp * g_out[s : s + rows]).sum().backward()
        logp.append(lp.detach())
        grad_h.append(h.grad)
    return {"logp": torch.cat(logp), "ent": torch.cat(ent), "grad_h": torch.cat(grad_h), "grad_w": weight.grad}


def bench_memory(n: int, hdim: int, vocab: int, chunk: int) -> dict[str, float]:
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in ("chunked", "naive"):
            out = os.path.join(tmp, f"{path}.pt")
            subprocess.run(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--mem-child",
                    path,
                    "--n",
                    str(n),
                    "--hdim",
                    str(hdim),
                    "--vocab",
                    str(vocab),
                    "--chunk",
                    str(chunk),
                    "--out",
                    out,
                ],
                check=True,
            )
            res[path] = torch.load(out)
    ref = _float64_reference(n, hdim, vocab)
    c, v = res["chunked"], res["naive"]
    out = {
        "logprob_mem_ratio": c["peak_delta"] / v["peak_delta"],
        "chunked_peak_mb": c["peak_delta"] / 2**20,
        "naive_peak_mb": v["peak_delta"] / 2**20,
        "chunked_s": c["seconds"],
        "naive_s": v["seconds"],
    }
    # float32 sums over 151k terms carry ~1e-5..1e-4 rounding in both paths: compare each to a
    # float64 reference as well as to each other.
    for key, name in (("logp", "logp"), ("ent", "entropy"), ("grad_h", "grad_hidden"), ("grad_w", "grad_weight")):
        out[f"{name}_diff"] = float((c[key] - v[key]).abs().max())
        out[f"{name}_err_chunked"] = float((c[key].double() - ref[key]).abs().max())
        out[f"{name}_err_naive"] = float((v[key].double() - ref[key]).abs().max())
    out.update(mem_tokens=float(n), mem_vocab=float(vocab), mem_chunk=float(chunk))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loss-tokens", type=int, default=1 << 20)
    ap.add_argument("--loss-repeats", type=int, default=41)
    ap.add_argument("--step-repeats", type=int, default=21)
    ap.add_argument("--method-repeats", type=int, default=15)
    ap.add_argument("--n", type=int, default=2048, help="tokens for the memory benchmark")
    ap.add_argument("--hdim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=QWEN25_VOCAB)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--mem-child", choices=["chunked", "naive"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mem_child:
        mem_child(args.mem_child, args.n, args.hdim, args.vocab, args.chunk, args.out)
        return

    t0 = time.perf_counter()
    results: dict[str, float] = {}
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    results.update(bench_loss(args.loss_tokens, args.loss_repeats))
    # The same on one thread: element-wise loss kernels scale with threads better than the
    # selection does, and one thread is far less sensitive to other processes on the machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    one = bench_loss(args.loss_tokens, args.loss_repeats)
    torch.set_num_threads(threads)
    results["stare_loss_ratio_1thread"] = one["stare_loss_ratio"]
    results["stare_c2_loss_ratio_1thread"] = one["stare_c2_loss_ratio"]
    print(
        f"[1] loss on {int(results['loss_tokens'])} tokens fwd+bwd: GRPO {results['grpo_loss_ms']:.1f} ms, "
        f"STARE-O1 {results['stare_loss_ms']:.1f} ms (weights alone {results['stare_weights_ms']:.1f} ms) "
        f"-> ratio {results['stare_loss_ratio']:.3f} (C2 {results['stare_c2_loss_ratio']:.3f}); "
        f"one thread: {results['stare_loss_ratio_1thread']:.3f} (C2 {results['stare_c2_loss_ratio_1thread']:.3f})",
        flush=True,
    )
    results.update(bench_step(args.step_repeats))
    print(
        f"[2] tiny Qwen2 micro-step ({int(results['step_tokens'])} tokens): GRPO {results['grpo_step_ms']:.1f} ms, "
        f"STARE {results['stare_step_ms']:.1f} ms -> ratio {results['stare_step_ratio']:.4f}",
        flush=True,
    )
    results.update(bench_memory(args.n, args.hdim, args.vocab, args.chunk))
    print(
        f"[3] logprobs+entropy N={args.n} V={args.vocab} chunk={args.chunk}: peak chunked "
        f"{results['chunked_peak_mb']:.0f} MB vs naive {results['naive_peak_mb']:.0f} MB -> ratio "
        f"{results['logprob_mem_ratio']:.3f}",
        flush=True,
    )
    for name in ("logp", "entropy", "grad_hidden", "grad_weight"):
        print(
            f"    {name:12s} max |chunked - naive| {results[name + '_diff']:.1e}; vs float64: chunked "
            f"{results[name + '_err_chunked']:.1e}, naive {results[name + '_err_naive']:.1e}",
            flush=True,
        )
    torch.set_num_threads(1)  # the methods' selections are single-threaded sorts and scans
    results.update(bench_methods(args.loss_tokens, args.method_repeats))
    torch.set_num_threads(threads)
    print(
        f"[4] token methods on {int(results['loss_tokens'])} tokens, one thread, vs GRPO "
        f"{results['methods_grpo_ms']:.1f} ms: "
        + ", ".join(f"{n} {results[n + '_loss_ratio']:.3f}" for n in sorted(TOKEN_METHODS.names())),
        flush=True,
    )
    results["bench_seconds"] = time.perf_counter() - t0
    # Other processes on the machine inflate every timing; the 1-minute load average at the end
    # says how far the ratios above can be trusted.
    results["load_avg_1m"] = os.getloadavg()[0]
    head = [
        "stare_loss_ratio",
        "stare_step_ratio",
        "logprob_mem_ratio",
        *(f"{n}_loss_ratio" for n in sorted(TOKEN_METHODS.names())),
    ]
    rest = [k for k in results if k not in head]
    print("RESULT " + " ".join(f"{k}={results[k]:.4g}" for k in head + rest))


if __name__ == "__main__":
    main()
