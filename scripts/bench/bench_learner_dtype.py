"""bf16 against fp32 for the DeepSpeed learner's update on CPU, on a real model (SmolLM2-135M-Instruct).

Two numbers decide `learner.dtype: auto` on a CPU:
1. bf16_step_ratio: seconds of one `Learner.train_step` (the trainer's clipped token-mean loss,
   chunked log-probs, forward + backward + AdamW) in bf16 over the same in fp32, on the same batch.
   Each side takes the fastest of --repeats interleaved steps after one warm-up step (on a shared
   machine other processes only ever add time).
2. logprob_abs_diff: what bf16 costs in accuracy: the mean |log pi_bf16 - log pi_fp32| over the
   batch's response tokens, both from the learner's own log-prob pass with the same (initial)
   weights. The rollout samples with fp32 on CPU, so this is the rollout/learner mismatch bf16 adds
   before the first weight sync; logprob_abs_diff_synced: after it (the rollout then holds the bf16
   learner's rounded weights, so only bf16 arithmetic differs).

The batch: Retool-style prompts in the model's chat template with short tool-using answers, as the
CPU recipe (configs/smollm2_cpu.yaml) trains on (~150 tokens a trajectory). bf16 runs at ZeRO 0 with
grad_accum_dtype=bf16 (what DeepSpeed 0.19 accepts there) or, with --zero-stage 1, fp32 masters and
fp32 accumulation; fp32 at the same stage.

Last line: RESULT bf16_step_ratio=... logprob_abs_diff=... logprob_abs_diff_synced=... fp32_s=... bf16_s=...
load=...
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = [
    ("What is 417*386?", "<code>\nprint(417*386)\n</code>\nThe product is 160962, so the answer is \\boxed{160962}."),
    ("A shop has 213 books, sells 45 and buys 7. How many are left?", "213 - 45 + 7 = 175. \\boxed{175}"),
    ("What is 1234+5678-910?", "<code>\nprint(1234+5678-910)\n</code>\nIt prints 6002: \\boxed{6002}."),
    ("12 boxes have 35 pens each. How many pens?", "Each box has 35 pens, 12 boxes: 12*35 = 420. \\boxed{420}"),
    ("What is 98*76?", "<code>\nx = 98*76\nprint(x)\n</code>\nThe interpreter gives 7448. \\boxed{7448}"),
    ("Ann has 40 coins and gets 12 more each day for 5 days. How many coins?", "40 + 5*12 = 100. \\boxed{100}"),
    ("What is 3021-1999+450?", "<code>\nprint(3021-1999+450)\n</code>\nSo the result is \\boxed{1472}."),
    ("25 cards cost 14 each. What is the total?", "25 cards at 14 each cost 25*14 = 350. \\boxed{350}"),
]


def build_trajs(tok, n: int) -> list:
    """n trajectories: the short Retool system prompt + problem (chat template), the answer as response."""
    from types import SimpleNamespace

    from envs.retool import SHORT_SYSTEM_PROMPT

    out = []
    for i in range(n):
        problem, answer = PROBLEMS[i % len(PROBLEMS)]
        msgs = [{"role": "system", "content": SHORT_SYSTEM_PROMPT}, {"role": "user", "content": problem}]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        prompt = list(tok(text, add_special_tokens=False)["input_ids"])
        resp = tok(answer + " Let me double-check it once more." * (i % 3), add_special_tokens=False)["input_ids"]
        resp = list(resp) + [tok.eos_token_id]
        out.append(SimpleNamespace(prompt_ids=prompt, response_ids=resp, loss_mask=[1] * len(resp)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--zero-stage", type=int, default=0, choices=(0, 1))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))

    import torch

    from stare_tir.learner import Learner, LearnerConfig
    from stare_tir.model import ModelConfig, resolve_model_path

    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    isa = sorted({f for f in ("avx512_bf16", "amx_bf16") if f in flags.split()})
    print(f"CPU bf16 flags: {isa or 'none'}; torch threads {torch.get_num_threads()}")
    path = resolve_model_path(ModelConfig(path="smollm2-135m-instruct"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    trajs = build_trajs(tok, args.trajectories)
    n_tok = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
    advantages = [1.0 if i % 2 == 0 else -1.0 for i in range(len(trajs))]

    def learner(dtype: str) -> Learner:
        accum = "bf16" if dtype == "bf16" and args.zero_stage == 0 else "auto"
        cfg = LearnerConfig(
            zero_stage=args.zero_stage,
            dtype=dtype,
            grad_accum_dtype=accum,
            lr=1e-6,
            weight_decay=0.0,
            micro_batch_tokens=2048,
        )
        return Learner(path, cfg, tok)

    learners = {"fp32": learner("fp32"), "bf16": learner("bf16")}
    logps = {k: lr.compute_logprobs_entropy(trajs)[0] for k, lr in learners.items()}  # same initial weights
    diff = torch.cat([(a - b).abs() for a, b in zip(logps["bf16"], logps["fp32"])])
    # After the first weight sync the fp32 rollout holds the bf16 learner's (rounded) weights: the
    # mismatch left is bf16 arithmetic alone. The fp32 learner with rounded weights stands in for it.
    fp32 = learners["fp32"]
    saved = [p.detach().clone() for p in fp32.model.parameters()]
    with torch.no_grad():
        for p in fp32.model.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    rounded = fp32.compute_logprobs_entropy(trajs)[0]
    with torch.no_grad():
        for p, s in zip(fp32.model.parameters(), saved):
            p.copy_(s)
    synced = torch.cat([(a - b).abs() for a, b in zip(logps["bf16"], rounded)])
    for lr in learners.values():  # warm-up: the first step allocates the optimizer state
        lr.train_step(trajs, advantages)
    best = {k: float("inf") for k in learners}
    for _ in range(args.repeats):  # interleaved: load changes hit both alike
        for k, lr in learners.items():
            t0 = time.perf_counter()
            lr.train_step(trajs, advantages)
            best[k] = min(best[k], time.perf_counter() - t0)
    ratio = best["bf16"] / best["fp32"]
    print(
        f"train_step of {len(trajs)} trajectories ({n_tok} tokens), ZeRO {args.zero_stage}: "
        f"fp32 {best['fp32']:.2f} s, bf16 {best['bf16']:.2f} s -> ratio {ratio:.3f}"
    )
    print(f"log-prob |bf16 - fp32|: mean {float(diff.mean()):.4f}, max {float(diff.max()):.4f} over {diff.numel()}")
    print(f"after a weight sync (same bf16-rounded weights, fp32 arithmetic): mean {float(synced.mean()):.4f}")
    print(
        f"RESULT bf16_step_ratio={ratio:.3f} logprob_abs_diff={float(diff.mean()):.4f} "
        f"logprob_abs_diff_synced={float(synced.mean()):.4f} "
        f"fp32_s={best['fp32']:.2f} bf16_s={best['bf16']:.2f} load={os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
