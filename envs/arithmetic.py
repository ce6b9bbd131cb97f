"""A synthetic tool-use task for the CPU default: arithmetic a tiny model cannot do in its head.

    probs = make_problems(2000, seed=0, split="train")     # disjoint from split="test"
    traces = make_sft_traces(probs[:500], sandbox)          # Retool-format SFT data, code really run
    split_assistant_segments(traces[0]["messages"][2]["content"])  # [(text, is_model_written), ...]

Why it fits: a ~100k-parameter transformer trained from scratch does not learn multi-digit
multiplication (3x3 digits) or carries over 4-digit sums reliably, but it can learn to copy the
numbers into `print(347*829)` and copy the interpreter's answer into `\\boxed{}`. Problem kinds:

- "mul":   What is 347*829?                              (2-3 digit operands)
- "chain": What is 4821+9377-2649?                       (3-4 digit operands)
- "word":  7 boxes have 48 pens each. How many pens?     (four short templates)
- "easy":  What is 7+5?                                  (solvable without the tool)

Splits: a problem belongs to "test" when a hash of its text falls in the test bucket (1 in 8), so
train and test are disjoint for every seed; the generator is seeded per (seed, split).

SFT traces are a deliberate mix: `tool_fraction` of them call the tool (code run in the real
sandbox through RetoolEnv, so the observation text is byte-identical to what RL rollouts see),
the others answer directly with the correct result. After SFT the model therefore calls the tool
only part of the time and fails most hard problems it answers directly: RL has clear room to
raise both the tool-call rate and the accuracy. `code_styles` (default: `print(EXPR)` only) can mix
ways of writing the tool call's code that print the same line (`x = EXPR` + `print(x)`): a
reward-neutral choice inside the tool mode.

With a chat tool format (`cfg.tool_format="hermes"`) a tool trace is written in the OpenAI
messages-with-tool-calls layout: an assistant message with `tool_calls` (`{"name": "python",
"arguments": {"code": ...}}`), the `tool` message holding the env's observation, and the final
assistant answer; the row carries the format's `tools`, so SFT renders it with the chat template
exactly as RL rollouts are rendered.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from envs.retool import RetoolConfig, RetoolEnv

KINDS = ("mul", "chain", "word", "easy")
_TEST_BUCKETS = 8  # 1 in 8 of all problem texts are test problems

_WORD_TEMPLATES = (
    # (text, python expression) with {a} {b} {c} filled in
    ("{a} boxes have {b} pens each. How many pens?", "{a}*{b}"),
    ("Ann has {a} coins and gets {b} more each day for {c} days. How many coins?", "{a}+{b}*{c}"),
    ("A shop has {a} books, sells {b} and buys {c}. How many books are left?", "{a}-{b}+{c}"),
    ("{a} cards cost {b} each. What is the total?", "{a}*{b}"),
)


@dataclass
class ArithmeticConfig:
    """The synthetic task of the CPU default."""

    # Problems in the RL training split.
    n_train: int = 2000
    # Problems in the held-out test split (disjoint from train by construction).
    n_test: int = 200
    # Seed of the problem generator (train and test are generated from it separately).
    seed: int = 0
    # Problem kinds to draw from (subset of mul, chain, word, easy).
    kinds: list[str] = field(default_factory=lambda: ["mul", "chain", "word", "easy"])
    # Relative frequency of each kind, aligned with `kinds`.
    kind_weights: list[float] = field(default_factory=lambda: [0.4, 0.25, 0.25, 0.1])
    # Most digits of a multiplication operand (3 keeps problems beyond a tiny model's head).
    max_digits: int = 3
    # SFT traces to make (from the start of the train split).
    n_sft: int = 500
    # Share of SFT traces that call the tool; the rest answer directly (room for RL to improve).
    tool_fraction: float = 0.5

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ValueError(f"kinds={self.kinds!r}: must be a non-empty subset of {list(KINDS)}")
        if (
            len(self.kind_weights) != len(self.kinds)
            or any(w < 0 for w in self.kind_weights)
            or sum(self.kind_weights) <= 0
        ):
            raise ValueError(f"kind_weights={self.kind_weights!r}: one weight >= 0 per kind, not all 0")
        if not 2 <= self.max_digits <= 6:
            raise ValueError(f"max_digits={self.max_digits!r}: must be in [2, 6]")
        if not 0.0 <= self.tool_fraction <= 1.0:
            raise ValueError(f"tool_fraction={self.tool_fraction!r}: must be in [0, 1]")
        for name in ("n_train", "n_test", "n_sft"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 0")


# ----------------------------------------------------------------------------- problems


def _num(rng: random.Random, lo_digits: int, hi_digits: int) -> int:
    d = rng.randint(lo_digits, hi_digits)
    return rng.randint(10 ** (d - 1), 10**d - 1)


def _draw(rng: random.Random, kind: str, max_digits: int) -> tuple[str, str]:
    """(problem text, python expression) of one problem."""
    if kind == "mul":
        a, b = _num(rng, 2, max_digits), _num(rng, 2, max_digits)
        expr = f"{a}*{b}"
        return f"What is {expr}?", expr
    if kind == "chain":
        a, b, c = _num(rng, 3, 4), _num(rng, 3, 4), _num(rng, 3, 4)
        op1, op2 = rng.choice("+-"), rng.choice("+-")
        expr = f"{a}{op1}{b}{op2}{c}"
        if evaluate(expr) < 0:  # keep answers non-negative
            expr = f"{a}+{b}{op2}{c}" if evaluate(f"{a}+{b}{op2}{c}") >= 0 else f"{a}+{b}+{c}"
        return f"What is {expr}?", expr
    if kind == "word":
        text, expr = rng.choice(_WORD_TEMPLATES)
        a, b, c = _num(rng, 2, 3), _num(rng, 2, 2), rng.randint(2, 9)
        if "-" in expr:
            a, b = max(a, b) + 100, min(a, b)
        vals = {"a": a, "b": b, "c": c}
        return text.format(**vals), expr.format(**vals)
    if kind == "easy":
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        op = rng.choice("+*")
        expr = f"{a}{op}{b}"
        return f"What is {expr}?", expr
    raise ValueError(f"kind={kind!r}: must be one of {KINDS}")


def evaluate(expr: str) -> int:
    """Value of an expression of non-negative integers, + - and * (usual precedence)."""
    if not re.fullmatch(r"\d+(?:[-+*]\d+)*", expr):
        raise ValueError(f"expr={expr!r}: only integers with + - *")
    total = 0
    for sign, term in re.findall(r"([-+]?)([\d*]+)", expr):
        value = 1
        for factor in term.split("*"):
            value *= int(factor)
        total += -value if sign == "-" else value
    return total


def _split_of(text: str) -> str:
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    return "test" if h % _TEST_BUCKETS == 0 else "train"


def make_problems(
    n: int,
    seed: int,
    split: Literal["train", "test"],
    *,
    kinds: list[str] | None = None,
    kind_weights: list[float] | None = None,
    max_digits: int = 3,
) -> list[dict]:
    """n distinct problems {"id", "problem", "answer", "kind", "expr"} of one split (seeded)."""
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r}: must be 'train' or 'test'")
    kinds = list(kinds or ArithmeticConfig().kinds)
    weights = list(kind_weights or (ArithmeticConfig().kind_weights if kinds == list(KINDS) else [1.0] * len(kinds)))
    ArithmeticConfig(kinds=kinds, kind_weights=weights, max_digits=max_digits)  # validates
    rng = random.Random(f"arithmetic-{seed}-{split}")
    out: list[dict] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 200 * n + 1000:
            raise ValueError(f"could not draw {n} distinct {split} problems from kinds {kinds}")
        kind = rng.choices(kinds, weights)[0]
        text, expr = _draw(rng, kind, max_digits)
        if text in seen or _split_of(text) != split:
            continue
        seen.add(text)
        answer = str(evaluate(expr))
        out.append(
            {"id": f"arith-{split}-{seed}-{len(out)}", "problem": text, "answer": answer, "kind": kind, "expr": expr}
        )
    return out


# ----------------------------------------------------------------------------- SFT traces


# Ways to write a tool call's code. Each prints the same line, so the interpreter's output and the
# grade are identical: which one a trace uses is a reward-neutral choice (the neutral-choice study,
# scripts/study/study_neutral_choice.py, watches whether RL keeps or collapses a mix of them).
CODE_STYLES: dict[str, Callable[[str], str]] = {
    "print": lambda expr: f"print({expr})",
    "assign": lambda expr: f"x = {expr}\nprint(x)",
}
DEFAULT_CODE_STYLES = ("print",)


def check_code_styles(styles: Sequence[str]) -> None:
    """Raise ValueError unless `styles` is a non-empty list of known code style names."""
    if isinstance(styles, str) or not styles:
        raise ValueError(f"code_styles={styles!r}: must be a non-empty list of names from {sorted(CODE_STYLES)}")
    unknown = sorted({s for s in styles if s not in CODE_STYLES})
    if unknown:
        raise ValueError(f"code_styles={list(styles)!r}: unknown style(s) {unknown}; known: {sorted(CODE_STYLES)}")


def tool_turn(problem: dict, style: str = "print") -> str:
    """The model turn that calls the tool (ends with the stop string, as in RL rollouts), its code
    written in one of CODE_STYLES."""
    check_code_styles([style])
    return f"<code>\n```python\n{CODE_STYLES[style](problem['expr'])}\n```\n</code>"


def tool_call_message(problem: dict, style: str = "print") -> dict:
    """The assistant message that calls the python tool (chat tool formats), OpenAI layout."""
    check_code_styles([style])
    code = CODE_STYLES[style](problem["expr"])
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": code}}}],
    }


def direct_answer(problem: dict) -> str:
    return f"{problem['expr']} = {problem['answer']}\n\\boxed{{{problem['answer']}}}"


def final_answer(answer: str) -> str:
    return f"\\boxed{{{answer}}}"


def sft_env_config() -> RetoolConfig:
    """The env settings the tiny task uses: the one-line prompt, few tool calls."""
    return RetoolConfig(prompt="short", max_tool_calls=2, obs_max_chars=128)


async def amake_sft_traces(
    problems: list[dict],
    sandbox: Any,
    *,
    tool_fraction: float = 0.5,
    seed: int = 0,
    cfg: RetoolConfig | None = None,
    code_styles: Sequence[str] = DEFAULT_CODE_STYLES,
    max_concurrency: int = 8,
    on_trace: Callable[[], None] | None = None,
) -> list[dict]:
    """Async version of make_sft_traces (use it inside a running event loop). on_trace: called
    after each finished trace (progress)."""
    if not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(f"tool_fraction={tool_fraction!r}: must be in [0, 1]")
    check_code_styles(code_styles)
    cfg = cfg or sft_env_config()
    rng = random.Random(f"sft-{seed}")
    plan = [rng.random() < tool_fraction for _ in problems]
    # Styles come from their own stream, so the tool/direct plan (and, with one style, every
    # trace) is exactly what it was before styles existed.
    styled = tuple(code_styles) != DEFAULT_CODE_STYLES
    style_rng = random.Random(f"sft-style-{seed}")
    styles = [style_rng.choice(list(code_styles)) for _ in problems] if styled else ["print"] * len(problems)
    sem = asyncio.Semaphore(max_concurrency)

    async def one(problem: dict, use_tool: bool, style: str) -> dict:
        env = RetoolEnv(problem, sandbox, cfg)
        chat = env.format.chat_turns
        after: list[dict] = []  # chat formats: the messages after the prompt
        try:
            if use_tool:
                call = tool_call_message(problem, style)
                turn = env.format.assistant_text(call) if chat else tool_turn(problem, style)
                for _ in range(3):  # infrastructure hiccups are retried (fresh env), code errors are not
                    async with sem:
                        res = await env.step(turn)
                    if not env.sandbox_error:
                        break
                    await env.close()
                    env = RetoolEnv(problem, sandbox, cfg)
                if env.sandbox_error or res.observation is None:
                    raise RuntimeError(f"sandbox failed on {problem['id']}: {res.info}")
                if chat:
                    printed = res.observation.strip()
                else:
                    printed = (
                        res.observation.strip().removeprefix("<interpreter>").removesuffix("</interpreter>").strip()
                    )
                if printed != problem["answer"]:
                    raise RuntimeError(f"{problem['id']}: code printed {printed!r}, expected {problem['answer']!r}")
                if chat:
                    text = turn + final_answer(printed)  # graded; the messages carry the tool turn
                    after = [
                        call,
                        {"role": "tool", "name": "python", "content": res.observation},
                        {"role": "assistant", "content": final_answer(printed)},
                    ]
                else:
                    text = turn + res.observation + final_answer(printed)
            else:
                text = direct_answer(problem)
            _, info = env.reward(text)
            if not info["correct"]:
                raise RuntimeError(f"{problem['id']}: trace graded wrong ({info})")
        finally:
            await env.close()
        messages = env.initial_messages() + (after or [{"role": "assistant", "content": text}])
        if on_trace is not None:
            on_trace()
        row = {"id": problem["id"], "messages": messages, "uses_tool": use_tool, "answer": problem["answer"]}
        if chat:  # the schemas the chat template shows (SFT renders the row with them)
            row["tools"] = env.tools
        if styled and use_tool:  # only then, so default traces stay byte-identical
            row["code_style"] = style
        return row

    return list(await asyncio.gather(*(one(p, t, s) for p, t, s in zip(problems, plan, styles))))


def make_sft_traces(
    problems: list[dict],
    sandbox: Any,
    *,
    tool_fraction: float = 0.5,
    seed: int = 0,
    cfg: RetoolConfig | None = None,
    code_styles: Sequence[str] = DEFAULT_CODE_STYLES,
) -> list[dict]:
    """Cold-start SFT traces {"id", "messages": [system, user, assistant], "uses_tool", "answer"}
    (+ "code_style" on tool traces when `code_styles` mixes styles: each tool trace draws one
    uniformly from the list, so a repeated name weighs more).

    `sandbox` is an async Sandbox (sandbox.make_sandbox(...)); tool traces run their code in it.
    A trace whose code does not print the right answer raises: SFT data is never wrong.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(
            amake_sft_traces(
                problems, sandbox, tool_fraction=tool_fraction, seed=seed, cfg=cfg, code_styles=code_styles
            )
        )
    raise RuntimeError("make_sft_traces called inside an event loop: await amake_sft_traces instead")


# An observation: the whitespace before the tag (the model's turn ends at "</code>"; RL appends
# the observation right there), the tagged span, then trailing blanks and one line break. The env
# writes "\n<interpreter>\n...\n</interpreter>\n"; traces from elsewhere vary (\r\n, no or extra
# newlines, trailing spaces), and each variation must still be masked. Only a span that follows a
# "</code>" is an observation (the only place RL puts one).
_OBS_RE = re.compile(r"\s*<interpreter>.*?</interpreter>[ \t]*(?:\r?\n)?", re.DOTALL)


def split_assistant_segments(text: str) -> list[tuple[str, bool]]:
    """Split an assistant response into (segment, is_model_written) in order.

    Interpreter observations (the "\\n<interpreter>\\n...\\n</interpreter>\\n" strings the env
    appends, and their newline variants) are not model-written; SFT tokenizes each segment
    separately and masks those, exactly like RL. The segments concatenate back to `text`.
    """
    out: list[tuple[str, bool]] = []
    pos = 0
    for m in _OBS_RE.finditer(text):
        if not text[: m.start()].endswith("</code>"):
            continue  # RL appends observations only after a code block: this one the model wrote
        if m.start() > pos:
            out.append((text[pos : m.start()], True))
        out.append((m.group(0), False))
        pos = m.end()
    if pos < len(text):
        out.append((text[pos:], True))
    return out


def _main() -> None:  # python -m envs.arithmetic --n 500 --out traces.jsonl
    import argparse
    import json

    ap = argparse.ArgumentParser(description="Write arithmetic SFT traces (runs code in the local sandbox).")
    ap.add_argument("--n", type=int, default=ArithmeticConfig.n_sft)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tool-fraction", type=float, default=0.5)
    ap.add_argument("--code-styles", nargs="+", default=list(DEFAULT_CODE_STYLES), help=f"of {sorted(CODE_STYLES)}")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from sandbox import SandboxConfig, make_sandbox

    async def run() -> list[dict]:
        async with make_sandbox(SandboxConfig()) as sb:
            probs = make_problems(args.n, args.seed, "train")
            return await amake_sft_traces(
                probs, sb, tool_fraction=args.tool_fraction, seed=args.seed, code_styles=args.code_styles
            )

    traces = asyncio.run(run())
    with open(args.out, "w", encoding="utf-8") as f:
        for t in traces:
            f.write(json.dumps(t) + "\n")
    print(f"wrote {len(traces)} traces ({sum(t['uses_tool'] for t in traces)} with the tool) to {args.out}")


if __name__ == "__main__":
    _main()
