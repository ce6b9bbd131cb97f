"""Cold-start SFT: teach the base model the Retool format before RL.

Traces are JSONL rows of either
  {"messages": [{"role": "system", ...}, {"role": "user", ...}, {"role": "assistant", "content": ...}]}
or {"text": ...} (see `encode_record`). Each row becomes exactly what the RL rollout engine would
have produced for the same conversation:

- prompt ids = the chat template of every message before the final assistant one, with
  add_generation_prompt=True (the same call the engine makes), tokenized as one string;
- the assistant text is split into model-written segments and interpreter observations
  ("\\n<interpreter>\\n...\\n</interpreter>\\n"); each segment is tokenized on its own and appended
  with `Trajectory.append` (model: loss_mask 1, observation: loss_mask 0), as the engine appends
  sampled turns and observations. Segments are encoded with the engine's own `encode_plain`, so a
  special-token string inside the text (printed by code, say) stays plain characters;
- the final <|im_end|> (the tokenizer's EOS, the token that ends an RL response) is appended as a
  model token: the model must learn to stop.

Rows in the OpenAI messages-with-tool-calls layout (a "tools" list, assistant messages with
"tool_calls", "tool" messages: native tool calling, `env.tool_format=hermes`) are encoded turn by
turn exactly as the rollout engine builds them (`stare_tir.rollout.chat_turns.ChatTurns`): each
assistant message becomes the text the model writes for it (its content, then each call as
`<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`, where generation stops), masked 1;
each tool message becomes the suffix the chat template renders for it, masked 0; the final
assistant message ends with the EOS. The loss mask covers exactly the assistant's tokens.

The loss is token-mean NLL over loss_mask == 1 tokens of the global batch (`Learner.sft_step`), so
interpreter output is never trained on, exactly as in RL. The result is an ordinary HF directory
(weights + tokenizer) that the RL stage loads like any model path.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from envs.arithmetic import split_assistant_segments  # the env's own observation format
from stare_tir.sft.config import SFTConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from stare_tir.rollout.trajectory import Trajectory


# ----------------------------------------------------------------------------------------------
# Encoding: the same token layout as an RL trajectory


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def check_record(record: Any) -> None:
    """The shape `encode_record` needs, checked without a tokenizer (start-up checks run this on
    every row before a model loads): a ValueError naming what is wrong."""
    if not isinstance(record, dict):
        raise ValueError(f"expected an object with 'messages' or 'text', got {type(record).__name__}")
    if "messages" in record:
        msgs = record["messages"]
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise ValueError("messages: expected a non-empty list of {role, content} objects")
        if msgs[-1].get("role") != "assistant":
            raise ValueError(
                f"messages: the last message must have role 'assistant' (it has role {msgs[-1].get('role')!r})"
            )
        if not isinstance(msgs[-1].get("content"), str):
            raise ValueError("messages: the last (assistant) message has no text content")
        if _is_tool_record(record):
            _check_tool_messages(msgs)
    elif "text" in record:
        if not isinstance(record["text"], str):
            raise ValueError("text: expected a string")
    else:
        raise ValueError(f"record has neither 'messages' nor 'text' (keys: {sorted(record)})")


def encode_record(record: dict, tokenizer: PreTrainedTokenizerBase) -> Trajectory:
    """One JSONL row -> a Trajectory (prompt_ids, response_ids, loss_mask) as RL would build it.

    {"messages": [...]}: the last message must be the assistant's; the messages before it form
    the prompt (chat template, add_generation_prompt=True).
    {"text": ...}: a chat-formatted string; the prompt is everything up to and including the last
    "<|im_start|>assistant\\n", the response the rest (a trailing "<|im_end|>" and whitespace are
    dropped from the text and the EOS token is appended). Without that header the whole text is the
    response (plain language modelling) and its first token serves as the prompt.
    """
    from stare_tir.rollout.engine import encode_plain  # how RL tokenizes observations
    from stare_tir.rollout.trajectory import Trajectory

    eos = tokenizer.eos_token_id
    check_record(record)
    if "messages" in record and _is_tool_record(record):
        return _encode_tool_record(record, tokenizer)
    if "messages" in record:
        msgs = record["messages"]
        prompt_text = tokenizer.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True)
        prompt_ids, response, end_with_eos = _encode(tokenizer, prompt_text), msgs[-1]["content"], True
    elif "text" in record:
        text, header = record["text"], "<|im_start|>assistant\n"
        cut = text.rfind(header)
        if cut >= 0:
            prompt_ids = _encode(tokenizer, text[: cut + len(header)])
            response = text[cut + len(header) :].rstrip()
            if tokenizer.eos_token and response.endswith(tokenizer.eos_token):
                response = response[: -len(tokenizer.eos_token)]
            end_with_eos = True
        else:
            ids = _encode(tokenizer, text)
            prompt_ids, response, end_with_eos = ids[:1], None, False
            traj = Trajectory(prompt_ids=prompt_ids)
            traj.append(ids[1:], [0.0] * len(ids[1:]), "model")
            return traj
    else:
        raise ValueError(f"record has neither 'messages' nor 'text' (keys: {sorted(record)})")
    if not prompt_ids:
        raise ValueError("empty prompt: the first response token needs context")
    traj = Trajectory(prompt_ids=prompt_ids)
    segments = split_assistant_segments(response)
    for segment, by_model in segments:
        if by_model and ("<interpreter>" in segment or "</interpreter>" in segment):
            # An unclosed or stray tag: interpreter text would be trained as if the model wrote it.
            tag = "<interpreter>" if "<interpreter>" in segment else "</interpreter>"
            at = segment.index(tag)
            raise ValueError(
                f"unmatched {tag} in the assistant text (near {segment[max(0, at - 40) : at + 60]!r}): "
                "interpreter output would be trained as model text; close every "
                "<interpreter>...</interpreter> span or remove the tag"
            )
    for segment, by_model in segments:
        # Plain text, as the engine encodes observations: a "<|im_end|>" printed by code (or quoted
        # in the model's code) stays characters; the only control token trained is the final EOS.
        ids = encode_plain(tokenizer, segment)
        if by_model:
            traj.append(ids, [0.0] * len(ids), "model")
        else:
            traj.append(ids, None, "obs")
    if end_with_eos:
        if eos is None:
            raise ValueError("the tokenizer has no eos_token: cannot end the response")
        traj.append([eos], [0.0], "model")
    return traj


def _is_tool_record(record: dict) -> bool:
    """A row in the OpenAI messages-with-tool-calls layout (native tool calling)."""
    msgs = record.get("messages") or []
    return "tools" in record or any(
        isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls")) for m in msgs
    )


def _check_tool_messages(msgs: list[dict]) -> None:
    """After the first assistant message: assistant turns, each with tool calls followed by one tool
    message, and a last assistant turn without calls (the layout a rollout produces)."""
    roles = [m.get("role") for m in msgs]
    if "assistant" not in roles:
        raise ValueError("messages: no assistant message")
    first = roles.index("assistant")
    for k in range(first, len(msgs)):
        m, role = msgs[k], roles[k]
        last = k == len(msgs) - 1
        if role == "assistant":
            calls = m.get("tool_calls") or []
            if not isinstance(m.get("content") or "", str):
                raise ValueError(f"messages[{k}]: assistant content must be text")
            if calls and (last or roles[k + 1] != "tool"):
                raise ValueError(f"messages[{k}]: an assistant tool call must be followed by its tool message")
            if not calls and not last:
                raise ValueError(f"messages[{k}]: an assistant message without tool calls must be the last one")
            if len(calls) > 1:
                raise ValueError(f"messages[{k}]: one tool call per assistant turn (generation stops at the first)")
        elif role == "tool":
            if roles[k - 1] != "assistant":
                raise ValueError(f"messages[{k}]: a tool message must follow the assistant turn that called it")
        else:
            raise ValueError(f"messages[{k}]: role {role!r} after the first assistant turn (only assistant and tool)")


def _encode_tool_record(record: dict, tokenizer: PreTrainedTokenizerBase) -> Trajectory:
    """A native tool-calling row, turn by turn as the rollout engine builds it (module docstring)."""
    from envs.tool_formats import make_tool_format
    from stare_tir.rollout.chat_turns import ChatTurns, encode_template_text
    from stare_tir.rollout.trajectory import Trajectory

    fmt = make_tool_format("hermes")  # the OpenAI tool-call layout is written in the Qwen/Hermes convention
    msgs = record["messages"]
    first = [m.get("role") for m in msgs].index("assistant")
    chat = ChatTurns(tokenizer, msgs[:first], record.get("tools") or fmt.tools)
    traj = Trajectory(prompt_ids=chat.prompt_ids())
    for m in msgs[first:]:
        if m["role"] == "assistant":
            text = fmt.assistant_text(m)
            ids = encode_template_text(tokenizer, text)  # as sampled: a <tool_call> special stays one id
            chat.model_turn(text)
            traj.append(ids, [0.0] * len(ids), "model")
        else:  # a tool turn: exactly what the template renders, the output neutralized as the env does
            content = m.get("content")
            content = content if isinstance(content, str) else json.dumps(content)
            traj.append(chat.tool_turn(fmt.observation(content), name=str(m.get("name") or "python")), None, "obs")
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token: cannot end the response")
    traj.append([tokenizer.eos_token_id], [0.0], "model")
    return traj


def load_records(source: str | Path | Sequence[dict]) -> list[dict]:
    """Rows from a JSONL file (blank lines skipped; a bad line is an error naming it), a parquet
    file (e.g. ReTool-SFT's train_2000.parquet, one row per conversation), or a list."""
    if not isinstance(source, (str, Path)):
        return list(source)
    if str(source).lower().endswith(".parquet"):
        import pyarrow.parquet as pq  # only parquet traces pay for pyarrow

        return pq.read_table(source).to_pylist()
    rows = []
    with open(source, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{source}:{n}: not valid JSON ({e.msg})") from None
    return rows


# ----------------------------------------------------------------------------------------------
# Training


def run_sft(
    cfg: SFTConfig,
    model_path: str | Path,
    data: str | Path | Sequence[dict],
    output_dir: str | Path,
    tokenizer: PreTrainedTokenizerBase | None = None,
    trust_remote_code: bool = False,
    checkpoints: str | Path | None = None,
    key: str = "",
) -> dict[str, Any]:
    """Fine-tune `model_path` on `data` (JSONL path or rows) and write an HF checkpoint to output_dir.

    Runs in one process or under torchrun/deepspeed (each rank takes its share of every batch).
    Returns a summary: output_dir, steps, examples, dropped (too long), tokens trained,
    first_loss / final_loss (mean over the first / last `window` steps, window = min(log_every,
    half the steps): a one-epoch run still shows how far the loss fell), val_loss (or None),
    seconds, this process's rank, and resumed_from (the step an SFT checkpoint restarted it at).

    checkpoints: a directory for resumable checkpoints every cfg.save_every steps (`step_N/`, a
    `latest` pointer, and `key` so a checkpoint of other inputs is never resumed); a run that
    finds one of the same key there continues from it, bit for bit the data order it had. Deleted
    once the model is written.
    """
    import dataclasses

    from loguru import logger
    from transformers import AutoTokenizer

    from stare_tir.learner import Learner
    from stare_tir.tracking import progress

    t_start = time.time()
    tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(str(model_path))
    examples, dropped = [], 0
    for i, row in enumerate(load_records(data), 1):
        try:
            ex = encode_record(row, tok)
        except ValueError as e:
            raise ValueError(f"SFT row {i} of {data if isinstance(data, (str, Path)) else 'the traces'}: {e}") from None
        if len(ex.prompt_ids) + len(ex.response_ids) > cfg.max_seq_len:
            dropped += 1
            continue
        examples.append(ex)
    if not examples:
        raise ValueError(f"no usable SFT rows ({dropped} longer than max_seq_len={cfg.max_seq_len})")
    rng = random.Random(cfg.seed)
    val: list = []
    if cfg.val_fraction > 0:
        order = list(range(len(examples)))
        rng.shuffle(order)
        n_val = max(1, int(round(cfg.val_fraction * len(examples))))
        val = [examples[i] for i in order[:n_val]]
        examples = [examples[i] for i in order[n_val:]]
    steps_per_epoch = math.ceil(len(examples) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    lcfg = cfg.learner
    if lcfg.lr_scheduler != "constant" and lcfg.total_steps == 0:
        lcfg = dataclasses.replace(lcfg, total_steps=max(total, lcfg.warmup_steps + 1))
    learner = Learner(model_path, lcfg, tok, trust_remote_code=trust_remote_code)
    main = learner.rank == 0
    if main:
        logger.info(
            f"SFT: {len(examples)} examples ({dropped} dropped as too long, {len(val)} held out), "
            f"{cfg.epochs} epochs x {steps_per_epoch} steps, world size {learner.world_size}"
        )

    orders = []  # every epoch's shuffle, drawn up front: a resumed run takes the same batches
    for _ in range(cfg.epochs):
        order = list(range(len(examples)))
        rng.shuffle(order)
        orders.append(order)
    losses: list[float] = []
    val_loss: float | None = None
    tokens = 0.0
    step = 0
    ckpt_root = Path(checkpoints) if checkpoints and cfg.save_every else None
    resumed = _resume_sft(learner, ckpt_root, key) if ckpt_root else None
    if resumed is not None:
        step, tokens, losses, val_loss = resumed["step"], resumed["tokens"], resumed["losses"], resumed["val_loss"]
        if main:
            logger.info(f"SFT: resumed from {ckpt_root} at step {step}/{total}")
    bar = progress(total, "sft", "batch", enabled=main, initial=step)
    for epoch in range(step // steps_per_epoch, cfg.epochs):
        order = orders[epoch]
        for s in range(step - epoch * steps_per_epoch, steps_per_epoch):
            batch = [examples[i] for i in order[s * cfg.batch_size : (s + 1) * cfg.batch_size]]
            m = learner.sft_step(learner.shard(batch))
            step += 1
            tokens += m["tokens"]
            if m["step_skipped"]:
                logger.warning(f"SFT step {step}: non-finite loss or gradient, step skipped")
            else:
                losses.append(m["loss"])
            bar.update(1)
            bar.set_postfix(epoch=epoch + 1, loss=f"{m['loss']:.4f}", gnorm=f"{m['grad_norm']:.3f}")
            if main and (step % cfg.log_every == 0 or step == total):
                logger.info(
                    f"SFT step {step}/{total} epoch {epoch + 1} loss {m['loss']:.4f} "
                    f"grad_norm {m['grad_norm']:.3f} lr {m['lr']:.2e} tokens {int(m['tokens'])}"
                )
            if ckpt_root is not None and step % cfg.save_every == 0 and step < total:
                state = {"step": step, "tokens": tokens, "losses": losses, "val_loss": val_loss}
                _save_sft(learner, ckpt_root, key, state)
        if val:
            val_loss = _mean_nll(learner, learner.shard(val))
            if main:
                logger.info(f"SFT epoch {epoch + 1}: held-out NLL {val_loss:.4f}")
    bar.close()
    learner.save_hf(output_dir)
    if ckpt_root is not None and main:
        shutil.rmtree(ckpt_root, ignore_errors=True)  # the model is written: nothing left to resume
    mean = lambda xs: float(sum(xs) / len(xs)) if xs else float("nan")  # noqa: E731
    window = max(1, min(cfg.log_every, len(losses) // 2))
    summary = {
        "output_dir": str(output_dir),
        "steps": step,
        "examples": len(examples),
        "dropped": dropped,
        "tokens": tokens,
        "first_loss": mean(losses[:window]),
        "final_loss": mean(losses[-window:]),
        "val_loss": val_loss,
        "seconds": time.time() - t_start,
        "rank": learner.rank,
        "resumed_from": resumed["step"] if resumed else None,
    }
    if main:
        logger.info(
            f"SFT done in {summary['seconds']:.1f}s: loss {summary['first_loss']:.4f} -> "
            f"{summary['final_loss']:.4f}; checkpoint {output_dir}"
        )
    return summary


def _save_sft(learner: Any, root: Path, key: str, state: dict) -> None:
    """A resumable SFT checkpoint at root/step_N; `latest` moves to it only once it is complete."""
    path = root / f"step_{state['step']:06d}"
    learner.save_checkpoint(path, state)  # collective
    if learner.rank == 0:
        (root / "key").write_text(key + "\n")
        tmp = root / "latest.tmp"
        tmp.write_text(path.name)
        tmp.replace(root / "latest")  # atomic: a kill mid-save leaves the previous pointer
        for stale in sorted(p for p in root.glob("step_*") if p.is_dir() and p != path):
            shutil.rmtree(stale, ignore_errors=True)


def _resume_sft(learner: Any, root: Path, key: str) -> dict | None:
    """The state of the latest SFT checkpoint in `root` made from the same inputs, loaded into
    `learner`; None when there is none (one of other inputs is deleted)."""
    pointer = root / "latest"
    stored = (root / "key").read_text().strip() if (root / "key").is_file() else None
    if not pointer.is_file() or not (root / pointer.read_text().strip()).is_dir():
        return None
    if stored != key:
        if learner.rank == 0:
            shutil.rmtree(root, ignore_errors=True)
        return None
    return learner.load_checkpoint(root / pointer.read_text().strip())


def _mean_nll(learner: Any, examples: list) -> float:
    """Token-mean NLL of loss_mask == 1 tokens over all ranks' examples (no update)."""
    import torch

    logps, _ = learner.compute_logprobs_entropy(examples)
    s = sum(float(-lp.sum()) for lp in logps)
    n = sum(sum(ex.loss_mask) for ex in examples)
    tot = learner.all_reduce_sum(torch.tensor([s, float(n)], dtype=torch.float64))
    return float(tot[0] / max(tot[1], 1.0))
