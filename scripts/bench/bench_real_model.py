"""Benchmark the trainer's pieces on a real model (SmolLM2-135M-Instruct), side by side in one run.

1. engine_overhead: the rollout engine (RolloutEngine over the HF backend, single turn, greedy)
   against transformers' own batched `generate` on the same prompt ids and token budget, on the
   same model object. Both are greedy, so both write (nearly) the same tokens; the ratio is of
   tokens/s: raw / engine (target <= 1.05).
2. learner_overhead: the DeepSpeed learner's update (`Learner.train_step`: ZeRO 0, fp32, the
   trainer's clipped token-mean loss, chunked log-probs) against a plain torch forward, backward,
   gradient clip and AdamW step on the same batch (the engine's trajectories of part 1), the same
   loss written by hand. learner_overhead = learner s / plain s (target <= 1.10).
3. sglang_engine_overhead: the engine over the SGLang backend against one raw `/generate` call
   with the same prompt ids (a list), greedy, on the real CPU server (`make sglang-cpu`) serving
   the same model: engine wall / raw wall. Skipped (reported "none") without the server venv.

Every ratio takes the fastest of --repeats interleaved runs of each side (as timeit does): on a
shared machine other processes only ever add time. gen_tok_s: the engine's tokens/s; train_tok_s:
prompt + response tokens per second through the learner's update; peak_rss_gb: this process's
peak resident memory (model, learner and its AdamW state, the plain copy: not the server's).

Last line: RESULT learner_overhead=... engine_overhead=... sglang_engine_overhead=... gen_tok_s=...
train_tok_s=... peak_rss_gb=... load=<1-minute load average at the end>
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = [
    "What is 417*386?",
    "A shop has 213 books, sells 45 and buys 7. How many books are left?",
    "What is 1234+5678-910?",
    "12 boxes have 35 pens each. How many pens?",
    "What is 98*76?",
    "Ann has 40 coins and gets 12 more each day for 5 days. How many coins?",
    "What is 3021-1999+450?",
    "25 cards cost 14 each. What is the total?",
]


class OneTurnEnv:
    """The Retool prompt (system + problem); whatever the model writes ends the trajectory."""

    stop_strings: list[str] = []

    def __init__(self, problem: dict) -> None:
        self.problem, self.stats, self.sandbox_error = problem, {"tool_calls": 0}, False

    def initial_messages(self) -> list[dict]:
        from envs.retool import SHORT_SYSTEM_PROMPT

        return [
            {"role": "system", "content": SHORT_SYSTEM_PROMPT},
            {"role": "user", "content": self.problem["problem"]},
        ]

    async def step(self, turn_text: str):
        from envs.base import StepResult

        return StepResult(None, True, {"reason": "answer"})

    def reward(self, text: str) -> tuple[float, dict]:
        return 0.0, {"correct": False, "pred": None}

    async def close(self) -> None:
        pass


def fastest(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def generated_tokens(rows, prompt_len: int, eos: set[int]) -> list[list[int]]:
    """Per row of a left-padded generate output: the new ids up to and including the first EOS."""
    out = []
    for row in rows.tolist():
        new = row[prompt_len:]
        cut = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
        out.append(new[:cut])
    return out


def plain_update(model, opt, trajs, advantages, pad_id: int) -> int:
    """The trainer's loss by hand: token-mean of -A * ratio over model tokens (ratio 1 on-policy,
    its gradient is A * grad log p), one padded batch, clip at 1.0, one AdamW step."""
    import torch

    seqs = [t.prompt_ids + t.response_ids for t in trajs]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width))
    adv = torch.zeros((len(seqs), width))
    for i, (t, s) in enumerate(zip(trajs, seqs)):
        ids[i, : len(s)], attn[i, : len(s)] = torch.tensor(s), 1
        lo = len(t.prompt_ids)
        mask[i, lo : len(s)] = torch.tensor(t.loss_mask, dtype=torch.float32)
        adv[i, lo : len(s)] = advantages[i]
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()  # [B, T-1, V]
    logp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]  # [B, T-1]
    ratio = torch.exp(logp - logp.detach())
    loss = -(adv[:, 1:] * ratio * mask[:, 1:]).sum() / mask[:, 1:].sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return int(attn.sum())


def learner_vs_plain(path: str, tok, trajs, repeats: int) -> tuple[float, float]:
    """(learner s / plain s, tokens/s through the learner's update), fastest of `repeats` each."""
    import torch
    from transformers import AutoModelForCausalLM

    from stare_tir.learner import Learner, LearnerConfig

    advantages = [1.0 if i % 2 == 0 else -1.0 for i in range(len(trajs))]
    learner = Learner(
        path, LearnerConfig(zero_stage=0, dtype="fp32", lr=1e-6, micro_batch_tokens=65536, weight_decay=0.0), tok
    )
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-6, weight_decay=0.0)
    n_tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs)

    def learner_step() -> None:
        learner.train_step(trajs, advantages)

    def plain_step() -> None:
        plain_update(plain, opt, trajs, advantages, learner.pad_id)

    learner_step(), plain_step()  # warm-up (first steps allocate the optimizer state)
    learner_s, plain_s = float("inf"), float("inf")
    for _ in range(repeats):  # interleaved: load changes hit both alike
        learner_s = min(learner_s, fastest(learner_step, 1)[0])
        plain_s = min(plain_s, fastest(plain_step, 1)[0])
    print(
        f"[2] update of {len(trajs)} trajectories ({n_tokens} tokens): learner {learner_s:.2f} s, "
        f"plain torch {plain_s:.2f} s -> {learner_s / plain_s:.3f}; {n_tokens / learner_s:.1f} tok/s"
    )
    return learner_s / plain_s, n_tokens / learner_s


def load_launch():
    spec = importlib.util.spec_from_file_location("sglang_cpu_launch", ROOT / "tools" / "sglang_cpu" / "launch.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def sglang_overhead(path: str, tok, prompt_ids: list[list[int]], new_tokens: int, repeats: int) -> float | None:
    """Engine over SGLangBackend vs one raw /generate call, on the real CPU server."""
    from stare_tir.rollout.backends._http import request_sync
    from stare_tir.rollout.backends.sglang import SGLangBackend
    from stare_tir.rollout.engine import RolloutConfig, RolloutEngine

    launch = load_launch()
    log = Path(tempfile.mkdtemp(prefix="bench_real_model_")) / "server.log"
    try:
        server = launch.start_server(log, model=Path(path))
    except launch.Unavailable as exc:
        print(f"[3] SGLang: unavailable ({str(exc).splitlines()[0]}); skipped")
        return None
    try:
        backend = SGLangBackend([server.url], tokenizer=tok)
        cfg = RolloutConfig(
            n_per_prompt=1, max_turns=1, max_total_tokens=new_tokens, max_new_tokens_per_turn=new_tokens,
            temperature=0.0, progress=False,
        )  # fmt: skip
        engine = RolloutEngine(backend, tok, OneTurnEnv, cfg)
        problems = [{"id": f"p{i}", "problem": p} for i, p in enumerate(PROBLEMS)]
        body = {"input_ids": prompt_ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": new_tokens}}

        def raw() -> int:
            return sum(len(a["output_ids"]) for a in request_sync("POST", server.url + "/generate", body, 600))

        def eng() -> int:
            trajs, _ = engine.run(problems)
            return sum(len(t.response_ids) for t in trajs)

        raw(), eng()  # warm-up
        raw_s, eng_s = float("inf"), float("inf")
        for _ in range(repeats):
            s, n_raw = fastest(raw, 1)
            raw_s = min(raw_s, s)
            s, n_eng = fastest(eng, 1)
            eng_s = min(eng_s, s)
        print(f"[3] SGLang: raw /generate {raw_s:.2f} s ({n_raw} tokens), engine {eng_s:.2f} s ({n_eng} tokens)")
        backend.close()
        return eng_s / raw_s
    finally:
        launch.stop(server)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=48, help="token budget per prompt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-sglang", action="store_true", help="skip part 3")
    args = ap.parse_args()

    import torch

    from stare_tir.model import ModelConfig, resolve_model_path
    from stare_tir.rollout.backends.hf import HFBackend
    from stare_tir.rollout.engine import RolloutConfig, RolloutEngine

    path = resolve_model_path(ModelConfig(path="smollm2-135m-instruct"))
    backend = HFBackend(path)
    tok, model = backend.tokenizer, backend.model
    print(f"model={path} threads={torch.get_num_threads()} load={os.getloadavg()[0]:.1f}")

    # ------------------------------------------------------------------ 1. engine vs raw generate
    cfg = RolloutConfig(
        n_per_prompt=1, max_turns=1, max_total_tokens=args.new_tokens, max_new_tokens_per_turn=args.new_tokens,
        temperature=0.0, progress=False,
    )  # fmt: skip
    engine = RolloutEngine(backend, tok, OneTurnEnv, cfg)
    problems = [{"id": f"p{i}", "problem": p} for i, p in enumerate(PROBLEMS)]
    prompt_ids = [engine._prompt_ids(OneTurnEnv(p)) for p in problems]
    batch = tok.pad({"input_ids": prompt_ids}, padding=True, padding_side="left", return_tensors="pt")
    eos = set(backend.eos_token_ids)

    def raw() -> int:
        with torch.inference_mode():
            out = model.generate(
                **batch, max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=backend.pad_token_id
            )
        return sum(map(len, generated_tokens(out, batch["input_ids"].shape[1], eos)))

    def eng():
        return engine.run(problems)[0]

    raw(), eng()  # warm-up
    raw_rate, eng_rate, trajs = 0.0, 0.0, None
    for _ in range(args.repeats):  # interleaved: load changes hit both alike
        s, n = fastest(raw, 1)
        raw_rate = max(raw_rate, n / s)
        s, trajs = fastest(eng, 1)
        eng_rate = max(eng_rate, sum(len(t.response_ids) for t in trajs) / s)
    engine_overhead = raw_rate / eng_rate
    print(f"[1] generation: raw generate {raw_rate:.1f} tok/s, engine {eng_rate:.1f} tok/s -> {engine_overhead:.3f}")

    # ------------------------------------------------------------------ 2. learner vs plain torch
    learner_overhead, train_tok_s = learner_vs_plain(path, tok, trajs, args.repeats)

    # ------------------------------------------------------------------ 3. SGLang engine vs raw
    backend.close()
    sglang = None if args.no_sglang else sglang_overhead(path, tok, prompt_ids, args.new_tokens, args.repeats)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    print(
        f"RESULT learner_overhead={learner_overhead:.3f} engine_overhead={engine_overhead:.3f} "
        f"sglang_engine_overhead={'none' if sglang is None else f'{sglang:.3f}'} gen_tok_s={eng_rate:.1f} "
        f"train_tok_s={train_tok_s:.1f} peak_rss_gb={peak:.2f} load={os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
