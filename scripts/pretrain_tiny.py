#!/usr/bin/env python
"""Pretrain the tiny base model that the CPU default starts from (the laptop-scale "Qwen2.5-Base").

A randomly initialised ~0.14M-parameter transformer cannot copy a number from its context: that
skill (an induction head) takes a couple of thousand steps to appear, far more than the CPU
default's budget. Real TIR training starts from a pretrained base model that already copies, so
the tiny default does too: this script pretrains one on synthetic code-and-math text in which
numbers recur (copying), and writes it, with its tokenizer, to `stare_tir/assets/tiny-base/`.

The corpus is half generic copying text and half code-interpreter text (a question, its
`print(...)` code, the `<interpreter>` output, a `\\boxed{}` result), the way a real base model has
seen code and its output in pretraining. It holds no chat template and no direct answers: how to
answer inside a conversation, and when to call the tool, are left to SFT and RL.
Deterministic for a given seed; about 6 minutes per 3,000 steps on 2 CPU cores.

    see stare_tir/assets/README.md for the two commands that made the shipped model
    python scripts/pretrain_tiny.py --steps 500 --out /tmp/base
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def number(rng: random.Random) -> int:
    return rng.randint(0, 10 ** rng.randint(1, 4) - 1)


def expression(rng: random.Random) -> str:
    k = rng.randint(2, 3)
    return rng.choice("+-*").join(str(number(rng)) for _ in range(k)).replace("--", "-")


def segment(rng: random.Random) -> str:
    """One piece of text in which some numbers or expressions appear twice (copying)."""
    e, n = expression(rng), number(rng)
    value = str(eval(e))  # e only holds digits and + - *
    choices = [
        f"copy {e} -> {e}\n",
        f"x = {e}\nprint(x)\n",
        f"print({e})\n{value}\n",
        f"<interpreter>\n{n}\n</interpreter>\nThe result is {n}. \\boxed{{{n}}}\n",
        f"The number {n} again: {n}.\n",
        f"\\boxed{{{n}}} so the answer is {n}\n",
    ]
    return rng.choice(choices)


def tool_use(rng: random.Random) -> str:
    """Code-interpreter text as found in tool-use corpora: a question, code, its output, a result."""
    e = expression(rng)
    value = str(eval(e))  # e only holds digits and + - *
    return (
        f"What is {e}?\n<code>\n```python\nprint({e})\n```\n</code>\n"
        f"<interpreter>\n{value}\n</interpreter>\n\\boxed{{{value}}}\n"
    )


def chat_tool_use(rng: random.Random, tok) -> str:
    """Tool-use text inside a chat transcript (the chat template a chat model is trained in)."""
    from envs.retool import SHORT_SYSTEM_PROMPT

    e = expression(rng)
    value = str(eval(e))  # e only holds digits and + - *
    reply = f"<code>\n```python\nprint({e})\n```\n</code>\n<interpreter>\n{value}\n</interpreter>\n\\boxed{{{value}}}"
    messages = [
        {"role": "system", "content": SHORT_SYSTEM_PROMPT},
        {"role": "user", "content": f"What is {e}?"},
        {"role": "assistant", "content": reply},
    ]
    return tok.apply_chat_template(messages, tokenize=False)


def document(rng: random.Random, tok, chat_fraction: float = 0.0) -> str:
    """Tool-use text (plain or, with chat_fraction, in chat transcripts) and generic copying text."""
    u = rng.random()
    if u < chat_fraction:
        return chat_tool_use(rng, tok)
    if u < chat_fraction + (1 - chat_fraction) / 2:
        return tool_use(rng)
    return "".join(segment(rng) for _ in range(rng.randint(2, 3)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=32, help="documents per step")
    parser.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (linear warmup and decay)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the corpus and the initialisation")
    parser.add_argument("--size", default="tiny", choices=["tiny", "small", "base"], help="model shape")
    parser.add_argument(
        "--out",
        default=str(ROOT / "stare_tir" / "assets" / "tiny-base"),
        help="output directory (HF model + tokenizer)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument(
        "--chat-fraction", type=float, default=0.0, help="share of documents that are tool-use chat transcripts"
    )
    parser.add_argument("--init", default=None, help="continue from this HF model directory instead of a fresh init")
    args = parser.parse_args()

    import torch
    from tqdm import tqdm

    from stare_tir.model import build_tiny_model, build_tiny_tokenizer

    torch.set_num_threads(args.threads)
    tok = build_tiny_tokenizer()
    if args.init:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.init)
    else:
        model = build_tiny_model(tok, size=args.size, seed=args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    warmup = max(1, args.steps // 30)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: min(1.0, (k + 1) / warmup) * max(0.05, 1.0 - k / args.steps)
    )
    rng = random.Random(args.seed)
    eos = tok.eos_token_id
    t0 = time.time()
    bar = tqdm(range(args.steps), desc="pretrain", unit="step")
    for _ in bar:
        docs = [
            tok(document(rng, tok, args.chat_fraction), add_special_tokens=False)["input_ids"] + [eos]
            for _ in range(args.batch_size)
        ]
        length = max(len(d) for d in docs)
        ids = torch.full((len(docs), length), tok.pad_token_id)  # [B, L]
        labels = torch.full((len(docs), length), -100)  # [B, L], padding not trained
        mask = torch.zeros((len(docs), length), dtype=torch.long)
        for i, d in enumerate(docs):
            ids[i, : len(d)] = torch.tensor(d)
            labels[i, : len(d)] = torch.tensor(d)
            mask[i, : len(d)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    print(f"pretrained {args.steps} steps in {time.time() - t0:.0f}s, final loss {loss.item():.3f}: {out}")


if __name__ == "__main__":
    main()
