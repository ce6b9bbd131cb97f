"""Cold-start SFT: RL's token layout, interpreter tokens masked exactly, a loadable checkpoint."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _observation(body: str) -> str:
    """The Retool env's observation text (what RL appends after a model turn, loss_mask 0)."""
    return f"\n<interpreter>\n{body}\n</interpreter>\n"


def _trace(a: int, b: int, c: int) -> tuple[dict, list[str], list[str]]:
    """A two-tool-call trace; returns (record, model-written pieces, observation pieces)."""
    model = [
        "Let me compute this with Python.\n<code>\n```python\nprint(" + f"{a} * {b})\n```\n</code>",
        "Now add the third number.\n<code>\n```python\nprint(" + f"{a * b} + {c})\n```\n</code>",
        f"The answer is \\boxed{{{a * b + c}}}.",
    ]
    obs = [_observation(str(a * b)), _observation(str(a * b + c))]
    text = model[0] + obs[0] + model[1] + obs[1] + model[2]
    record = {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. You may run Python code."},
            {"role": "user", "content": f"What is {a} * {b} + {c}?"},
            {"role": "assistant", "content": text},
        ]
    }
    return record, model, obs


@pytest.fixture(scope="module", params=["tiny", "qwen2.5"])
def tokenizer(request):
    from stare_tir.model import build_qwen_tokenizer, build_tiny_tokenizer

    return build_tiny_tokenizer() if request.param == "tiny" else build_qwen_tokenizer()


def test_sft_mask_excludes_interpreter_tokens_exactly(tokenizer):
    from stare_tir.sft.train import encode_record

    record, model, obs = _trace(347, 829, 1234)
    ex = encode_record(record, tokenizer)
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731

    # Prompt: the chat template with the generation prompt, as the rollout engine builds it.
    prompt_text = tokenizer.apply_chat_template(record["messages"][:2], tokenize=False, add_generation_prompt=True)
    assert ex.prompt_ids == enc(prompt_text)

    # Response: model turn, observation, model turn, observation, model turn, <|im_end|>; each
    # piece tokenized on its own (RL never re-tokenizes across a turn boundary).
    from stare_tir.rollout.engine import encode_plain

    # (No special-token strings in this trace, so plain and default encodings agree.)
    assert all(encode_plain(tokenizer, t) == enc(t) for t in model + obs)
    pieces = [(model[0], 1), (obs[0], 0), (model[1], 1), (obs[1], 0), (model[2], 1)]
    want_ids = [i for text, _ in pieces for i in enc(text)] + [tokenizer.eos_token_id]
    want_mask = [m for text, m in pieces for _ in enc(text)] + [1]
    assert ex.response_ids == want_ids
    assert ex.loss_mask == want_mask
    # Token level: the masked tokens are exactly the two observations, nothing more or less ...
    masked_spans = [(s, e) for s, e, kind in ex.turns if kind == "obs"]
    assert [tokenizer.decode(ex.response_ids[s:e]) for s, e in masked_spans] == obs
    assert [ex.response_ids[s:e] for s, e in masked_spans] == [enc(o) for o in obs]
    # ... and the trained tokens are exactly the model's text plus the final <|im_end|>.
    trained = [t for t, m in zip(ex.response_ids, ex.loss_mask) if m]
    assert trained[-1] == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.decode(trained[:-1]) == "".join(model)
    ex.check()  # Trajectory invariants: spans tile the response, masks and logprobs aligned


def test_segmentwise_tokenization_differs_from_whole_text(tokenizer):
    """Why segments are tokenized separately: BPE merges across a turn boundary otherwise."""
    from stare_tir.sft.train import encode_record

    record, _, _ = _trace(12, 34, 5)
    ex = encode_record(record, tokenizer)
    whole = tokenizer.encode(record["messages"][2]["content"], add_special_tokens=False)
    assert ex.response_ids[:-1] != whole


def test_text_records_match_messages_records(tokenizer):
    from stare_tir.sft.train import encode_record

    record, _, _ = _trace(21, 43, 65)
    as_text = {"text": tokenizer.apply_chat_template(record["messages"], tokenize=False)}
    a, b = encode_record(record, tokenizer), encode_record(as_text, tokenizer)
    assert (a.prompt_ids, a.response_ids, a.loss_mask) == (b.prompt_ids, b.response_ids, b.loss_mask)


def test_run_sft_trains_on_model_tokens_and_writes_a_loadable_checkpoint(tiny_path, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stare_tir.learner import LearnerConfig
    from stare_tir.sft.train import SFTConfig, encode_record, run_sft

    g = random.Random(0)
    rows = [_trace(g.randint(10, 99), g.randint(10, 99), g.randint(100, 999))[0] for _ in range(24)]
    data = tmp_path / "traces.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = SFTConfig(
        epochs=3, batch_size=8, learner=LearnerConfig(lr=3e-3, lr_scheduler="cosine", micro_batch_tokens=1024)
    )
    tok = AutoTokenizer.from_pretrained(tiny_path)
    summary = run_sft(cfg, tiny_path, data, tmp_path / "sft")

    model_tokens = sum(sum(encode_record(r, tok).loss_mask) for r in rows)
    all_tokens = sum(len(encode_record(r, tok).response_ids) for r in rows)
    assert summary["steps"] == 9 and summary["dropped"] == 0
    assert summary["tokens"] == 3 * model_tokens < 3 * all_tokens  # the loss counts model tokens only
    assert summary["final_loss"] < summary["first_loss"] - 0.5

    out = AutoModelForCausalLM.from_pretrained(tmp_path / "sft", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(out.parameters(), base.parameters()))
    assert moved > 1e-3
    reloaded_tok = AutoTokenizer.from_pretrained(tmp_path / "sft")
    assert reloaded_tok.encode(rows[0]["messages"][2]["content"]) == tok.encode(rows[0]["messages"][2]["content"])


def test_sft_cli_help_lists_keys_without_importing_torch():
    code = (
        "import runpy, sys\n"
        "sys.argv = ['sft_coldstart.py', '--help']\n"
        "try:\n"
        "    runpy.run_path('scripts/sft_coldstart.py', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
    for key in ("--model", "--data", "--output", "--config", "learner.zero_stage", "learner.lr=0.002", "epochs=3"):
        assert key in out.stdout


def test_observations_are_plain_text_as_in_rl(tokenizer):
    """Code that prints a control-token string must not turn into that control token."""
    from stare_tir.rollout.engine import encode_plain
    from stare_tir.sft.train import encode_record

    model = "Check the output.\n<code>\n```python\nprint('<|im_end|>')\n```\n</code>"
    obs = _observation("<|im_end|>")
    record = {
        "messages": [
            {"role": "user", "content": "Print it."},
            {"role": "assistant", "content": model + obs + "Done: \\boxed{0}."},
        ]
    }
    ex = encode_record(record, tokenizer)
    ((s, e),) = [(s, e) for s, e, kind in ex.turns if kind == "obs"]
    assert ex.response_ids[s:e] == encode_plain(tokenizer, obs)
    assert tokenizer.eos_token_id not in ex.response_ids[s:e]
    assert ex.response_ids.count(tokenizer.eos_token_id) == 1 and ex.response_ids[-1] == tokenizer.eos_token_id
