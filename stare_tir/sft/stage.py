"""The SFT stage of a training run: traces -> cold-start SFT -> the RL stage's starting model.

Its outputs are reused, never guessed at: each SFT model is stored with `sft_key.json`, a hash of
everything that produced it (base model weights, tokenizer and chat template, the traces, the SFT
settings), and each synthetic traces file with `traces_key.json`. A run reuses a model (or
traces) only when the hash matches: its own from an earlier start, or one of a sibling run
directory (`runs/a` and `runs/b` share one SFT when their SFT inputs are equal, so a quick
experiment does not make 16,000 traces again). A stored model made from other inputs is never
reused silently: in a user-named `sft.output` it is refused, naming what changed.

    <run_dir>/sft/traces.jsonl + traces_key.json     synthetic traces (made in the sandbox)
    <run_dir>/sft/model/ (+ sft_key.json)            the SFT checkpoint (HF format)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from loguru import logger

from envs.arithmetic import DEFAULT_CODE_STYLES
from stare_tir.config import to_dict
from stare_tir.errors import StartupError
from stare_tir.model import load_tokenizer, model_fingerprint
from stare_tir.train_config import TrainConfig

KEY_FILE = "sft_key.json"
TRACES_KEY_FILE = "traces_key.json"


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def digest(inputs: Any) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def traces_inputs(cfg: TrainConfig) -> dict[str, Any]:
    """What the SFT traces are: the synthetic task's settings, or the content hash of a file."""
    if cfg.sft.traces == "arithmetic":
        inputs = {
            "kind": "arithmetic",
            "num_traces": cfg.sft.num_traces,
            "tool_fraction": cfg.sft.tool_fraction,
            "seed": cfg.data.seed,
            # the reward function does not write traces (and leaving it out keeps older keys)
            "env": {k: v for k, v in to_dict(cfg.env).items() if k not in ("reward", "reward_timeout_s")},
        }
        if inputs["env"].get("tool_format") == "retool":  # absent at the default: older keys still match
            del inputs["env"]["tool_format"]
        if list(cfg.sft.code_styles) != list(DEFAULT_CODE_STYLES):  # absent at the default: older keys still match
            inputs["code_styles"] = list(cfg.sft.code_styles)
        return inputs
    return {"kind": "file", "sha256": _file_sha256(cfg.sft.traces)}


def sft_inputs(cfg: TrainConfig, base_model: str) -> dict[str, Any]:
    """Everything that determines the SFT model (its hash is the reuse key)."""
    template = cfg.model.chat_template
    if template and "{" not in template and Path(template).is_file():
        template = Path(template).read_text()
    return {
        "base_model": model_fingerprint(base_model),
        "tokenizer": model_fingerprint(cfg.model.tokenizer) if cfg.model.tokenizer else "",
        "chat_template": hashlib.sha256(template.encode()).hexdigest()[:16] if template else "",
        "traces": traces_inputs(cfg),
        # how often it checkpoints does not change the model
        "train": {k: v for k, v in to_dict(cfg.sft.train).items() if k != "save_every"},
    }


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _differences(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [prefix.rstrip(".")]


def _read_key(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "key" in data else None


def _write_key(path: Path, key: str, inputs: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"key": key, "inputs": inputs}, indent=2, default=str) + "\n")
    tmp.replace(path)  # written last and atomically: a key file means the output is complete


def _link_copy(src: Path, dst: Path) -> None:
    """Copy a directory or file by hard links where the file system allows (a 7B model costs no
    space), so that this run directory keeps its inputs when the other one is deleted."""

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=link, dirs_exist_ok=True)
    else:
        link(str(src), str(dst))


def sft_output(cfg: TrainConfig) -> Path:
    """Where the SFT checkpoint goes: sft.output, or <trainer.run_dir>/sft/model."""
    return Path(cfg.sft.output) if cfg.sft.output else Path(cfg.trainer.run_dir) / "sft" / "model"


def sft_checkpoints(out: Path) -> Path:
    """Where an SFT in progress checkpoints (sft.train.save_every): beside its output."""
    return out.parent / f"{out.name}.checkpoints"


def check_sft_traces(cfg: TrainConfig) -> None:
    """The traces file exists and every row has the shape SFT needs, before any model loads."""
    if not cfg.sft.enabled or cfg.sft.traces == "arithmetic":
        return
    if not Path(cfg.sft.traces).is_file():
        raise StartupError(
            f"sft.traces={cfg.sft.traces!r}: no such JSONL file (use 'arithmetic' for the "
            'synthetic task, or a path to {"messages": [...]} rows)'
        )
    from stare_tir.sft.train import check_record, load_records

    try:
        rows = load_records(cfg.sft.traces)
    except (ValueError, OSError) as e:
        raise StartupError(f"sft.traces={cfg.sft.traces!r}: {e}") from None
    for n, row in enumerate(rows, 1):
        try:
            check_record(row)
        except ValueError as e:
            raise StartupError(
                f"sft.traces={cfg.sft.traces!r}: row {n}: {e}; fix or remove that row "
                '(each row: {"messages": [..., {"role": "assistant", "content": ...}]} or {"text": ...})'
            ) from None


def _sibling_output(run_dir: Path, key_path: str, key: str) -> Path | None:
    """The key file `<other run dir>/<key_path>` of a sibling run directory whose output was made
    from the same inputs (`key`), if any."""
    here = run_dir.resolve()
    for key_file in sorted(here.parent.glob(f"*/{key_path}")):
        if here.parent / key_file.relative_to(here.parent).parts[0] == here:
            continue
        stored = _read_key(key_file)
        if stored is not None and stored["key"] == key:
            return key_file
    return None


def make_synthetic_traces(cfg: TrainConfig, out_path: Path) -> list[dict]:
    """Cold-start traces of the arithmetic task, their code run in a real sandbox session; rank 0
    writes them (with their key) to `out_path`. Progress is shown while they are made."""
    from envs.arithmetic import amake_sft_traces, make_problems
    from sandbox import make_sandbox
    from stare_tir.tracking import progress

    problems = make_problems(cfg.sft.num_traces, seed=cfg.data.seed + 1, split="train")
    logger.info(f"sft: making {len(problems)} traces of the arithmetic task (tool calls run in the sandbox)")
    bar = progress(len(problems), "sft traces", "trace", enabled=_rank() == 0)

    async def go() -> list[dict]:
        async with make_sandbox(cfg.sandbox) as sandbox:
            return await amake_sft_traces(
                problems,
                sandbox,
                tool_fraction=cfg.sft.tool_fraction,
                seed=cfg.data.seed,
                cfg=cfg.env,
                code_styles=cfg.sft.code_styles,
                on_trace=lambda: bar.update(1),
            )

    try:
        traces = asyncio.run(go())
    finally:
        bar.close()
    if _rank() == 0:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_path.with_name(out_path.name + ".tmp")
        tmp.write_text("".join(json.dumps(t) + "\n" for t in traces))
        tmp.replace(out_path)
        inputs = traces_inputs(cfg)
        _write_key(out_path.with_name(TRACES_KEY_FILE), digest(inputs), inputs)
    logger.info(
        f"sft: wrote {len(traces)} traces ({sum(t['uses_tool'] for t in traces)} with a tool call) to {out_path}"
    )
    return traces


def sft_traces(cfg: TrainConfig, run_dir: Path) -> list[dict] | Path:
    """The SFT data: a user's file, or synthetic traces (reused when made from the same inputs)."""
    if cfg.sft.traces != "arithmetic":
        return Path(cfg.sft.traces)
    key = digest(traces_inputs(cfg))
    own = run_dir / "sft" / "traces.jsonl"
    stored = _read_key(own.with_name(TRACES_KEY_FILE))
    if own.is_file() and stored is not None and stored["key"] == key:
        logger.info(f"sft: reusing the traces in {own} (made from the same inputs)")
        return own
    other = _sibling_output(run_dir, f"sft/{TRACES_KEY_FILE}", key) if cfg.sft.reuse else None
    if other is not None and (other.parent / "traces.jsonl").is_file():
        source = other.parent / "traces.jsonl"
        logger.info(f"sft: reusing the traces of {source} (made from the same inputs)")
        if _rank() == 0:
            for name in ("traces.jsonl", TRACES_KEY_FILE):
                (own.parent / name).unlink(missing_ok=True)
                _link_copy(other.parent / name, own.parent / name)
        return source
    return make_synthetic_traces(cfg, own)


def check_template_for_tools(cfg: TrainConfig, tokenizer: Any, base_model: str) -> None:
    """A chat tool format (env.tool_format=hermes) needs a chat template that shows tools and keeps
    earlier turns as they were: refused in one line before traces are made (chat_turns.py)."""
    from envs.tool_formats import make_tool_format
    from stare_tir.model import chat_template_name
    from stare_tir.rollout.chat_turns import check_tool_template

    check_tool_template(tokenizer, make_tool_format(cfg.env.tool_format), chat_template_name(cfg.model, base_model))


def sft_stage(
    cfg: TrainConfig, base_model: str, run_dir: Path, *, resume: bool = False, overwrite: bool = False
) -> tuple[str, dict]:
    """Cold-start SFT, or the reuse of an SFT model made from the same inputs; returns
    (model path, summary). overwrite: replace a user-named sft.output made from other inputs."""
    from stare_tir.sft.train import run_sft

    inputs = sft_inputs(cfg, base_model)
    key = digest(inputs)
    out = sft_output(cfg)
    named = bool(cfg.sft.output)
    if (out / "config.json").is_file():
        stored = _read_key(out / KEY_FILE)
        if stored is not None and stored["key"] == key:
            logger.info(f"sft: reusing {out} (made from the same inputs, key {key})")
            return str(out), {"reused": True, "from": str(out), "key": key}
        changed = _differences(stored["inputs"], inputs) if stored is not None else ["no record of its inputs"]
        if resume and not named:
            logger.warning(f"sft: resuming with the run's own SFT model {out}, made from other inputs ({changed})")
            return str(out), {"reused": True, "from": str(out), "key": stored["key"] if stored else None}
        if named and not overwrite:
            raise StartupError(
                f"sft.output={str(out)!r} holds an SFT model made from other inputs (changed: "
                f"{', '.join(changed)}): choose another sft.output, delete it, or pass --overwrite to replace it"
            )
        logger.warning(f"sft: replacing {out}, made from other inputs (changed: {', '.join(changed)})")
        if _rank() == 0:  # all but the logs: stare-sft logs into sft.output (train.log is open)
            for old in out.iterdir():
                if re.fullmatch(r"train(\.rank\d+)?\.log", old.name):
                    continue
                if old.is_dir() and not old.is_symlink():
                    shutil.rmtree(old)
                else:
                    old.unlink()
    if not named and cfg.sft.reuse:
        other = _sibling_output(run_dir, f"sft/model/{KEY_FILE}", key)
        if other is not None:
            source = other.parent
            logger.info(f"sft: reusing {source} (made from the same inputs, key {key})")
            if _rank() == 0:
                _link_copy(source, out)
            return str(source), {"reused": True, "from": str(source), "key": key}
    check_sft_traces(cfg)
    tokenizer = load_tokenizer(cfg.model, base_model)
    check_template_for_tools(cfg, tokenizer, base_model)
    data = sft_traces(cfg, run_dir)
    # The policy's tokenizer (model.tokenizer, model.chat_template) is saved with the checkpoint.
    summary = run_sft(
        cfg.sft.train,
        base_model,
        data,
        out,
        tokenizer=tokenizer,
        trust_remote_code=cfg.model.trust_remote_code,
        checkpoints=sft_checkpoints(out),
        key=key,
    )
    if _rank() == 0:
        _write_key(out / KEY_FILE, key, inputs)
    return str(out), {**summary, "key": key}
