"""The same GRPO work through this trainer and through TRL's `GRPOTrainer`, side by side.

Install the peer first: `pip install -e '.[peer]'` (trl==1.16.0; it adds only trl itself to an
environment that has this project's dependencies). Without it the script says so in one line and
exits with status 2.

The work, identical on both sides:
  * SmolLM2-135M-Instruct (model.path=smollm2-135m-instruct: the packaged GGUF dequantized once to
    an fp32 HF directory; TRL loads that same directory);
  * 4 arithmetic problems a step (the trainer's own prompt order: `PromptSampler` over
    `data.arithmetic_train_size=64` problems, seed 0; TRL gets them in that order with
    `shuffle_dataset=False`), the same short Retool system prompt, 4 samples each (16 completions),
    at most 64 new tokens, temperature 1, one turn, no tools (env.max_tool_calls=0);
  * reward: +1 if the repo's builtin grader finds the gold answer, else -1 (the env's reward here;
    the same `get_grader("builtin").check` in a plain reward function there). The untrained model
    rarely gets these right, so most groups have equal rewards and zero advantages: both sides still
    run the whole update on them (loss 0, a full forward and backward), which is what is timed;
  * GRPO with group-std advantages and the token-mean loss (this trainer: algo.name=grpo,
    algo.loss_agg=token-mean; TRL: loss_type="dapo", which TRL 1.16 documents as normalising by
    the active tokens of the global accumulated batch: the same token mean), clip 0.2, beta=0 (no
    KL, no reference model), one optimizer step per 16 completions (TRL: per_device_train_batch_size
    =16, num_generations=4, gradient_accumulation_steps=1; here learner.micro_batch_tokens=4096 so
    the batch is one micro-batch too), AdamW lr 5e-6, weight decay 0, constant schedule, grad clip
    1.0, fp32, CPU, no activation checkpointing (TRL's configs turn it on by default: off here);
  * one torch thread each (OMP_NUM_THREADS=1 and torch.set_num_threads(1) in every child).

Each side runs in its own subprocess, alternating (ours, TRL, ours, TRL, ...): this trainer as a
user runs it (`train_main` with --config configs/smollm2_cpu.yaml and dotted overrides: the
command `scripts/train_tir.py` runs), TRL as its docs show (`GRPOTrainer(...).train()`). The first
--warmup steps of each run are not measured. Per side:
  * step_s: median seconds per step: this trainer's `time/step` from the run's metrics.jsonl; TRL's
    from a callback's `on_step_begin` to its `on_step_end` (generation, reward, loss, backward and
    the optimizer step; TRL's own logged `step_time` leaves the optimizer step out, so it is not used);
  * s_per_token: measured seconds / tokens generated in those steps (this trainer:
    rollout/response_len x 16; TRL: completions/mean_length x 16);
  * cpu_step_s: CPU seconds (user + system, getrusage of the child's own process) per measured step,
    sampled at the end of each step (this trainer: around `rl_step`, wrapped in the child; TRL: its
    callback); cpu_total_s: the whole child (start-up, model loading, evaluation, saving, and the
    child's own children) from wait4;
  * peak_rss_gb: ru_maxrss of the child from wait4 (the largest of it and its waited-for children,
    never a sum); rss_steps_gb: the child's peak up to its last measured step (before the final
    checkpoint and HF export this trainer writes and TRL, with save_strategy="no", does not).

Where the memory difference comes from (the structure read off the code; the peaks are what the
bench measures, the split between causes is not measured piece by piece). This trainer holds one
more copy of the weights: its HF rollout backend loads its own model from the path
(`HFBackend.from_config` gets the path, not the learner's module) and gets the learner's weights
after each step by copying them in place (`update_weights`): ~0.54 GB of fp32 weights besides the
DeepSpeed learner's model, gradients and AdamW moments. TRL generates with the module it trains
(`unwrap_model_for_generation`): one model, its gradients and AdamW's moments. Yet on a first
measurement TRL peaked higher (docs/benchmarks.md), most likely because of the loss: TRL computes the
logits of every completion position of the batch at once ([16, 65, 49,152] fp32, ~0.2 GB a
tensor; its log-softmax, entropy and their gradients are several such tensors), while this
trainer's log-probs are chunked (stare_tir/algos/logprobs.py: logits of at most
learner.logprob_chunk_size tokens exist at a time, recomputed in the backward). Also in this
trainer's peak: DeepSpeed's engine and imports, the no-grad recompute pass over the batch before
the update (old log-probs and entropy; TRL skips it when ratios are exactly 1), the evaluation
before and after RL (one held-out problem, data.arithmetic_eval_size=1) and the final checkpoint
and HF export (rss_steps_gb leaves those out). The sandbox workers are separate processes that
only idle here; wait4's ru_maxrss takes the largest process, not their sum.

--tools: TRL 1.16 accepts Python functions (`GRPOTrainer(tools=[...])`, transformers >= 5), but
only for a chat template that renders a tool-calling conversation (`supports_tool_calling`) and a
response parser it knows for that template (`add_response_schema`). SmolLM2-135M-Instruct's ChatML
template has neither (it prints only role and content), so TRL refuses this model with tools; this
trainer's Retool format (`<code>` tags answered by `<interpreter>`) needs no template support. The
flag checks that live on the installed TRL and prints `RESULT tools=unsupported reason=...`.
Swapping in a tool-capable ChatML template TRL knows (its qwen2_5.jinja uses the same <|im_start|>
tokens) would get past the check, but the untrained model writes neither that template's
<tool_call> JSON nor <code> blocks, so such a run would time no tool calls on either side.

Last line: RESULT step_ratio=<ours/TRL median step> token_ratio=<ours/TRL s per generated token>
cpu_ratio=<ours/TRL CPU s per step> rss_ratio=<ours/TRL peak RSS> load=<1-minute load average>
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

TRL_VERSION = "1.16.0"
INSTALL = "pip install -e '.[peer]'"
PROMPTS_PER_STEP, SAMPLES, MAX_NEW_TOKENS, LR = 4, 4, 64, 5e-6
# Problems the prompt order is drawn from: more than a default run's steps x 4, so no prompt repeats.
TRAIN_SIZE = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2, help="measured steps per run (default 2)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps at the start of each run (default 1)")
    p.add_argument("--repeats", type=int, default=2, help="runs per side, alternating (default 2)")
    p.add_argument("--tools", action="store_true", help="check whether TRL can run this model with a Python tool")
    p.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)  # internal: one side's run
    p.add_argument("--out", help=argparse.SUPPRESS)  # internal: where a child writes its numbers
    args = p.parse_args(argv)
    for name in ("steps", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name}={getattr(args, name)}: must be >= 1")
    if args.warmup < 0:
        p.error(f"--warmup={args.warmup}: must be >= 0")
    if (args.steps + args.warmup) * PROMPTS_PER_STEP > TRAIN_SIZE:
        p.error(f"--steps + --warmup: at most {TRAIN_SIZE // PROMPTS_PER_STEP} steps (the prompt pool's size)")
    return args


def trl_problem() -> str | None:
    """None when the pinned TRL is importable; otherwise the one line that says how to get it."""
    if importlib.util.find_spec("trl") is None:
        return f"bench_peer: TRL is not installed: run `{INSTALL}` (trl=={TRL_VERSION}) and rerun"
    version = importlib.metadata.version("trl")
    if version != TRL_VERSION:
        print(f"bench_peer: TRL {version} installed, measured against {TRL_VERSION}: numbers may differ", flush=True)
    return None


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def ordered_problems(steps: int) -> list[dict]:
    """The problems this trainer's sampler hands out over `steps` steps, in its order."""
    from stare_tir.data import DataConfig, PromptSampler, load_split

    problems = load_split(DataConfig(train="arithmetic", arithmetic_train_size=TRAIN_SIZE), "train")
    return PromptSampler(problems, seed=0).take(steps * PROMPTS_PER_STEP)


def system_prompt() -> str:
    from envs.retool import SHORT_SYSTEM_PROMPT

    return SHORT_SYSTEM_PROMPT


# ----------------------------------------------------------------------------------------------
# The two sides (each in its own child process)


def ours_argv(run_dir: Path, steps: int) -> list[str]:
    """This trainer's command line for the work (the module docstring says what each part is)."""
    return [
        "--config",
        str(ROOT / "configs" / "smollm2_cpu.yaml"),
        "model.path=smollm2-135m-instruct",
        "trainer.backend=hf",
        f"trainer.run_dir={run_dir}",
        f"trainer.steps={steps}",
        f"trainer.prompts_per_step={PROMPTS_PER_STEP}",
        "trainer.eval_every=0",
        "trainer.eval_n=1",
        "trainer.save_every=100000",
        "trainer.samples_every=0",
        "trainer.seed=0",
        f"data.arithmetic_train_size={TRAIN_SIZE}",
        "data.arithmetic_eval_size=1",
        "data.seed=0",
        "sft.enabled=false",
        "env.prompt=short",
        "env.max_tool_calls=0",
        "sandbox.workers=1",
        f"rollout.n_per_prompt={SAMPLES}",
        "rollout.max_turns=1",
        f"rollout.max_total_tokens={MAX_NEW_TOKENS}",
        f"rollout.max_new_tokens_per_turn={MAX_NEW_TOKENS}",
        "rollout.temperature=1.0",
        "algo.name=grpo",
        "algo.loss_agg=token-mean",
        "algo.clip_low=0.2",
        "algo.clip_high=0.2",
        "learner.zero_stage=0",
        "learner.dtype=fp32",
        f"learner.lr={LR}",
        "learner.weight_decay=0.0",
        "learner.lr_scheduler=constant",
        "learner.warmup_steps=0",
        "learner.grad_clip=1.0",
        "learner.micro_batch_tokens=4096",
    ]


def run_ours(steps: int) -> dict:
    """Train through the user's entry point; `rl_step` is wrapped only to read the CPU clock."""
    import torch

    torch.set_num_threads(1)
    import stare_tir.trainer.loop as loop
    from stare_tir.app.cli import train_main

    cpu_s: list[float] = []  # CPU seconds of each step
    rss: list[float] = []  # peak RSS (GB) at the end of each step
    inner = loop.rl_step

    def timed_step(*a, **kw):
        start = _cpu_s()
        out = inner(*a, **kw)
        cpu_s.append(_cpu_s() - start)
        rss.append(_rss_gb())
        return out

    loop.rl_step = timed_step
    with tempfile.TemporaryDirectory(prefix="bench_peer_ours_") as tmp:
        run_dir = Path(tmp) / "run"
        rc = train_main(ours_argv(run_dir, steps))
        if rc:
            raise SystemExit(f"bench_peer: this trainer's run failed (exit status {rc})")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    by_step = {r["step"]: r for r in rows if "time/step" in r}
    step_s = [by_step[s]["time/step"] for s in sorted(by_step)]
    tokens = [by_step[s]["rollout/response_len"] * PROMPTS_PER_STEP * SAMPLES for s in sorted(by_step)]
    return {"step_s": step_s, "cpu_s": cpu_s, "tokens": tokens, "rss_gb": rss}


def run_trl(steps: int) -> dict:
    """TRL's GRPOTrainer on the same model directory, prompts, reward and settings."""
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envs.grading.grader import get_grader
    from stare_tir.model import ensure_smollm2_checkpoint

    path = str(ensure_smollm2_checkpoint())
    system = system_prompt()
    rows = [
        {
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": p["problem"]}],
            "gold": p["answer"],
        }
        for p in ordered_problems(steps)
    ]
    grader = get_grader("builtin")

    def correct(completions, gold, **_) -> list[float]:
        return [
            1.0 if grader.check(c[0]["content"], str(g), timeout_s=3.0).correct else -1.0
            for c, g in zip(completions, gold)
        ]

    marks: list[tuple[float, float, float, float]] = []  # (wall, cpu) at a step's start, then at its end
    begun: list[tuple[float, float]] = []
    lengths: dict[int, float] = {}
    rss: list[float] = []

    class Clock(TrainerCallback):
        # With gradient_accumulation_steps=1 both are called once per optimizer step, around the
        # generation, the loss, the backward and the optimizer step (transformers' inner loop).
        def on_step_begin(self, args, state, control, **kw):
            begun.append((time.perf_counter(), _cpu_s()))

        def on_step_end(self, args, state, control, **kw):
            marks.append((*begun[-1], time.perf_counter(), _cpu_s()))
            rss.append(_rss_gb())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths[state.global_step] = logs["completions/mean_length"]

    with tempfile.TemporaryDirectory(prefix="bench_peer_trl_") as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=PROMPTS_PER_STEP * SAMPLES,
            gradient_accumulation_steps=1,
            num_generations=SAMPLES,
            max_completion_length=MAX_NEW_TOKENS,
            temperature=1.0,
            loss_type="dapo",
            epsilon=0.2,
            beta=0.0,
            learning_rate=LR,
            weight_decay=0.0,
            lr_scheduler_type="constant",
            warmup_steps=0,
            max_grad_norm=1.0,
            # TRL's configs default to activation checkpointing (a second forward in the backward);
            # this trainer's learner does not checkpoint unless asked: the same work is without it.
            gradient_checkpointing=False,
            max_steps=steps,
            shuffle_dataset=False,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
            fp16=False,
            seed=0,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(path)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=correct,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tok,
            callbacks=[Clock()],
        )
        trainer.train()
    return {
        "step_s": [end - start for start, _, end, _ in marks],
        "cpu_s": [end - start for _, start, _, end in marks],
        "tokens": [lengths.get(s, float("nan")) * PROMPTS_PER_STEP * SAMPLES for s in range(1, len(marks) + 1)],
        "rss_gb": rss,
    }


# ----------------------------------------------------------------------------------------------
# The parent: alternate the children, read their numbers, compare


def run_child(side: str, steps: int) -> dict:
    """One side's run in a fresh process pinned to one thread; its numbers plus wait4's rusage."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory(prefix="bench_peer_") as tmp:
        out = Path(tmp) / "out.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            side,
            "--steps",
            str(steps),
            "--warmup",
            "0",
            "--out",
            str(out),
        ]
        wall = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        err = proc.stderr.read() if proc.stderr else ""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0 or not out.is_file():
            tail = "\n".join(err.strip().splitlines()[-15:])
            raise SystemExit(f"bench_peer: the {side} run failed (exit status {proc.returncode}):\n{tail}")
        got = json.loads(out.read_text())
    got["wall_s"] = time.perf_counter() - wall
    got["cpu_total_s"] = usage.ru_utime + usage.ru_stime
    got["peak_rss_gb"] = usage.ru_maxrss / 2**20
    if len(got["step_s"]) != steps:
        raise SystemExit(f"bench_peer: the {side} run reported {len(got['step_s'])} steps, not {steps}")
    return got


def summarize(runs: list[dict], warmup: int) -> dict:
    """Per side: medians over the measured steps of every run; the peaks' largest."""
    step_s = [s for r in runs for s in r["step_s"][warmup:]]
    cpu_s = [c for r in runs for c in r["cpu_s"][warmup:]]
    tokens = sum(t for r in runs for t in r["tokens"][warmup:])
    return {
        "step_s": statistics.median(step_s),
        "s_per_token": sum(step_s) / tokens if tokens else float("nan"),
        "tokens_per_step": tokens / len(step_s),
        "cpu_step_s": statistics.median(cpu_s),
        "cpu_total_s": statistics.median(r["cpu_total_s"] for r in runs),
        "peak_rss_gb": max(r["peak_rss_gb"] for r in runs),
        "rss_steps_gb": max(r["rss_gb"][-1] for r in runs),
        "wall_s": statistics.median(r["wall_s"] for r in runs),
    }


def tools_check() -> str:
    """Why TRL cannot run this model with a Python tool ("" when it could)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    from stare_tir.model import ensure_smollm2_checkpoint

    tok = AutoTokenizer.from_pretrained(str(ensure_smollm2_checkpoint()))
    if not supports_tool_calling(tok):
        return "smollm2_chat_template_renders_no_tool_calls"
    try:
        add_response_schema(tok)
    except ValueError:
        return "no_tool_call_parser_for_smollm2_template"
    return ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    steps = args.warmup + args.steps
    if args.child:
        got = run_ours(steps) if args.child == "ours" else run_trl(steps)
        Path(args.out).write_text(json.dumps(got))
        return 0
    problem = trl_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if args.tools:
        reason = tools_check()
        if reason:
            print(f"TRL {importlib.metadata.version('trl')} cannot run SmolLM2-135M-Instruct with a Python tool")
            print(f"RESULT tools=unsupported reason={reason}")
            return 0
        print("TRL could run a tool with this template, but this benchmark has no tool side yet")
        print("RESULT tools=unsupported reason=not_implemented_in_bench")
        return 0
    from stare_tir.model import ensure_smollm2_checkpoint

    ensure_smollm2_checkpoint()  # converted once here, so neither child pays for it
    runs: dict[str, list[dict]] = {"ours": [], "trl": []}
    for r in range(args.repeats):
        for side in ("ours", "trl"):
            got = run_child(side, steps)
            runs[side].append(got)
            print(
                f"run {r + 1}/{args.repeats} {side}: steps "
                + " ".join(f"{s:.1f}" for s in got["step_s"])
                + f" s, wall {got['wall_s']:.0f} s, peak rss {got['peak_rss_gb']:.2f} GB",
                flush=True,
            )
    sums = {side: summarize(rs, args.warmup) for side, rs in runs.items()}
    for side, m in sums.items():
        print(
            f"{side:>4}: step_s={m['step_s']:.2f} s_per_token={m['s_per_token']:.4f} "
            f"tokens_per_step={m['tokens_per_step']:.0f} cpu_step_s={m['cpu_step_s']:.2f} "
            f"cpu_total_s={m['cpu_total_s']:.0f} peak_rss_gb={m['peak_rss_gb']:.2f} "
            f"rss_steps_gb={m['rss_steps_gb']:.2f} wall_s={m['wall_s']:.0f}"
        )
    ours, trl = sums["ours"], sums["trl"]
    print(
        f"RESULT step_ratio={ours['step_s'] / trl['step_s']:.3f} "
        f"token_ratio={ours['s_per_token'] / trl['s_per_token']:.3f} "
        f"cpu_ratio={ours['cpu_step_s'] / trl['cpu_step_s']:.3f} "
        f"rss_ratio={ours['peak_rss_gb'] / trl['peak_rss_gb']:.3f} load={os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
