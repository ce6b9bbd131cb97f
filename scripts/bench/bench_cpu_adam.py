"""CPU optimizer step for offloaded optimizer state: DeepSpeed's CPU Adam vs torch's AdamW.

With `zero_optimization.offload_optimizer.device=cpu` the fp32 master weights and Adam moments of
each rank's partition live in host memory, and the optimizer step runs on the CPU. This measures,
side by side in one process, one AdamW step over N fp32 parameters with:

- torch.optim.AdamW, default implementation (foreach; what the learner passed before),
- torch.optim.AdamW(fused=True) (torch's fused CPU kernel),
- deepspeed.ops.adam.DeepSpeedCPUAdam (adamw_mode; compiled on first use, the compile is timed
  separately and cached by torch's extension loader).

Every optimizer steps the same parameters and gradients for the same number of steps; the updated
weights are compared (they must agree to float32 rounding). The last line is
`RESULT key=value ...` with seconds per step and the speed-up of each over torch's default.

    python scripts/bench/bench_cpu_adam.py [--params 50e6] [--steps 5] [--threads N]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=50e6, help="fp32 parameters in the partition (default 50e6)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per optimizer, after one warm-up (default 5)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, all cores)")
    a = ap.parse_args()
    if a.params < 1 or a.steps < 1:
        ap.error("--params and --steps must be >= 1")

    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    n = int(a.params)
    # A few tensors of a transformer's shapes' order, not one flat vector: the foreach path's cost
    # depends on tensor count.
    sizes = [n // 8] * 8
    sizes[-1] += n - sum(sizes)
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=g) * 0.02 for s in sizes]
    grads = [[torch.randn(s, generator=g) * 1e-3 for s in sizes] for _ in range(2)]
    hyper = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    def run(make) -> tuple[float, list]:
        params = [torch.nn.Parameter(t.clone()) for t in init]
        opt = make(params)
        times = []
        for k in range(a.steps + 1):
            for p, gr in zip(params, grads[k % 2]):
                p.grad = gr
            t0 = time.perf_counter()
            opt.step()
            if k > 0:
                times.append(time.perf_counter() - t0)
        return sum(times) / len(times), [p.detach() for p in params]

    results: dict[str, object] = {"params": n, "threads": torch.get_num_threads()}
    t_default, w_ref = run(lambda ps: torch.optim.AdamW(ps, **hyper))
    t_fused, w_fused = run(lambda ps: torch.optim.AdamW(ps, fused=True, **hyper))
    results["torch_adamw_s"] = round(t_default, 4)
    results["torch_fused_s"] = round(t_fused, 4)
    diff = max(float((x - y).abs().max()) for x, y in zip(w_ref, w_fused))
    print(f"torch AdamW (foreach): {t_default:.4f} s/step   fused: {t_fused:.4f} s/step (max |dw| {diff:.1e})")
    try:
        t0 = time.perf_counter()
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(8))])  # builds (or loads) the op
        results["ds_compile_s"] = round(time.perf_counter() - t0, 1)
        t_ds, w_ds = run(lambda ps: DeepSpeedCPUAdam(ps, adamw_mode=True, **hyper))
        diff = max(float((x - y).abs().max()) for x, y in zip(w_ref, w_ds))
        print(
            f"DeepSpeedCPUAdam: {t_ds:.4f} s/step (max |dw| vs torch {diff:.1e}; op ready in {results['ds_compile_s']} s)"
        )
        results["ds_cpu_adam_s"] = round(t_ds, 4)
        results["ds_max_abs_diff"] = f"{diff:.1e}"
        results["ds_speedup"] = round(t_default / t_ds, 2)
    except Exception as e:  # no compiler, no deepspeed: say so in the RESULT line
        print(f"DeepSpeedCPUAdam unavailable: {type(e).__name__}: {e}")
        results["ds_cpu_adam_s"] = "unavailable"
    results["fused_speedup"] = round(t_default / t_fused, 2)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in results.items()))


if __name__ == "__main__":
    main()
