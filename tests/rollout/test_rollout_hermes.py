"""Native tool calling (env.tool_format=hermes) through the rollout engine, token-in/token-out.

The law under test: at every turn boundary the ids the backend was conditioned on are exactly the
trajectory's ids so far (what the learner trains on), and for a prefix-preserving template the whole
trajectory is exactly the template's rendering of the conversation, tokenized: the model's own ids
as sampled, each tool turn the template's suffix for it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from envs.retool import RetoolConfig, RetoolEnv
from envs.tool_formats import make_tool_format
from sandbox.base import ExecResult, ExecStatus
from stare_tir.model import TINY_TEMPLATES, pretrained_tiny_base
from stare_tir.rollout.chat_turns import ChatTurns, TemplateError, check_tool_template, encode_template_text, render
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine
from stare_tir.sft.train import encode_record

HERE = Path(__file__).parent / "templates"
TINY_TOOLS = TINY_TEMPLATES / "tiny_tools.jinja"
QWEN25 = HERE / "qwen2_5_instruct.jinja"
QWEN3 = HERE / "qwen3.jinja"
PROBLEM = {"id": "p", "problem": "What is 6*7?", "answer": "42"}
CALL_1 = '<think>\nMultiply with code.\n</think>\n\n<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call>'
BAD_CALL = '<tool_call>\n{"name": "python", "arguments": {"code": \n</tool_call>'
FINAL = "<think>\nIt printed 42.\n</think>\n\nThe answer is \\boxed{42}."


def tokenizer(kind: str, template: Path):
    if kind == "tiny":
        tok = AutoTokenizer.from_pretrained(str(pretrained_tiny_base()))
    else:
        from stare_tir.model import build_qwen_tokenizer

        tok = copy.deepcopy(build_qwen_tokenizer())
    tok.chat_template = template.read_text()
    return tok


class EvalSandbox:
    """Runs `print(<arithmetic>)` (enough for the scripted turns)."""

    def session(self, stateless=False):
        class Session:
            async def run(self, code, timeout=None):
                out = str(eval(code.removeprefix("print(").removesuffix(")"), {"__builtins__": {}}))
                return ExecResult(ExecStatus("ok"), 0, None, out + "\n", "", False, False, 0.01, "")

            async def __aenter__(self):
                return self

            async def __aexit__(self, *exc):
                return None

        return Session()


def engine_for(tok, turns, scripted_backend_cls, **rollout):
    cfg = RetoolConfig(tool_format="hermes", prompt="short")
    # Turns as the ids the model samples: template specials (Qwen's <tool_call>) are one id each.
    ids = [
        encode_template_text(tok, t.removesuffix("<EOS>")) + ([tok.eos_token_id] if t.endswith("<EOS>") else [])
        for t in turns
    ]
    backend = scripted_backend_cls(tokenizer=tok, turns=ids)
    rc = RolloutConfig(
        n_per_prompt=1, max_total_tokens=rollout.pop("max_total_tokens", 2000), progress=False, **rollout
    )
    return RolloutEngine(backend, tok, lambda p: RetoolEnv(p, EvalSandbox(), cfg), rc), backend


@pytest.mark.parametrize(
    "kind, template", [("tiny", TINY_TOOLS), ("qwen", TINY_TOOLS), ("qwen", QWEN25), ("tiny", QWEN25), ("qwen", QWEN3)]
)
def test_trained_ids_are_the_conditioned_ids_at_every_turn_boundary(kind, template, scripted_backend_cls):
    tok = tokenizer(kind, template)
    engine, backend = engine_for(tok, [CALL_1, BAD_CALL, FINAL + "<EOS>"], scripted_backend_cls)
    try:
        (traj,), stats = engine.run([PROBLEM])
    finally:
        engine.close()
    traj.check()
    assert traj.finish_reason == "answer" and traj.tool_calls == 1 and traj.reward == 1.0
    assert stats["rollout/tool_calls"] == 1 and stats["rollout/tool_format_errors"] == 1
    # Every call's input is the trajectory so far: prompt + all earlier model and tool tokens.
    model_spans = traj.model_spans()
    assert len(backend.calls) == len(model_spans) == 3
    full = traj.prompt_ids + traj.response_ids
    for call, (start, _) in zip(backend.calls, model_spans):
        assert call.prompt_ids == full[: len(traj.prompt_ids) + start]
        assert "</tool_call>" in call.stop
    # The model's tokens are the sampled ids, untouched, and only they are trained on.
    sampled = [i for s, e in model_spans for i in traj.response_ids[s:e]]
    assert sampled == [i for i, m in zip(traj.response_ids, traj.loss_mask) if m]
    # And the whole is the template's rendering of the conversation, <think> blocks kept as generated.
    env = RetoolEnv(PROBLEM, None, RetoolConfig(tool_format="hermes", prompt="short"))
    messages = env.initial_messages() + [
        {"role": "assistant", "content": CALL_1},
        {"role": "tool", "name": "python", "content": "42"},
        {"role": "assistant", "content": BAD_CALL},
        {"role": "tool", "name": "python", "content": env.format.observation(env.format.find_call(BAD_CALL).error)},
        {"role": "assistant", "content": FINAL},
    ]
    whole = encode_template_text(tok, render(tok, messages, env.tools, generation_prompt=False))
    assert full == whole[: len(full)] and traj.response_ids[-1] == tok.eos_token_id
    assert tok.decode(full).count("<think>") == 2


def test_the_qwen_tool_turn_is_the_template_suffix_with_special_ids():
    tok = tokenizer("qwen", QWEN25)
    fmt = make_tool_format("hermes")
    chat = ChatTurns(tok, [{"role": "user", "content": "hi"}], fmt.tools)
    chat.model_turn(CALL_1)
    ids = chat.tool_turn("42")
    assert (
        tok.decode(ids)
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids[0] == tok.convert_tokens_to_ids("<|im_end|>")


def test_tool_call_is_one_token_in_qwen_and_several_in_the_tiny_vocabulary():
    tiny = tokenizer("tiny", TINY_TOOLS)
    qwen = tokenizer("qwen", QWEN25)
    assert len(encode_template_text(qwen, "<tool_call>")) == 1
    assert len(encode_template_text(tiny, "<tool_call>")) > 1  # byte-level pieces of a 593-id vocabulary


@pytest.mark.parametrize("template", [TINY_TOOLS, QWEN25])
@pytest.mark.parametrize("kind", ["tiny", "qwen"])
def test_the_prefix_check_passes_for_the_tiny_and_the_official_qwen25_templates(kind, template):
    check_tool_template(tokenizer(kind, template), make_tool_format("hermes"), str(template))


def test_a_template_that_drops_earlier_think_blocks_is_refused_in_one_line():
    tok = tokenizer("qwen", HERE / "broken_drops_think.jinja")
    with pytest.raises(TemplateError) as e:
        check_tool_template(tok, make_tool_format("hermes"), "broken_drops_think.jinja")
    msg = str(e.value)
    assert "\n" not in msg and "broken_drops_think.jinja" in msg and "not prefix-preserving" in msg
    assert "character " in msg


@pytest.mark.parametrize(
    "template", [HERE / "smollm2_135m_instruct.jinja", Path(pretrained_tiny_base()) / "chat_template.jinja"]
)
def test_templates_without_tool_support_are_refused_with_the_way_out(template):
    tok = tokenizer("tiny", template)
    with pytest.raises(TemplateError) as e:
        check_tool_template(tok, make_tool_format("hermes"), str(template))
    msg = str(e.value)
    assert "\n" not in msg and str(template) in msg and "cannot call tools" in msg
    assert "env.tool_format=retool" in msg and "model.chat_template=" in msg


def test_retool_needs_nothing_of_the_template():
    check_tool_template(
        tokenizer("tiny", Path(pretrained_tiny_base()) / "chat_template.jinja"), make_tool_format("retool")
    )


def test_the_tiny_tools_template_renders_like_the_shipped_one_without_tools():
    shipped = tokenizer("tiny", Path(pretrained_tiny_base()) / "chat_template.jinja")
    tools = tokenizer("tiny", TINY_TOOLS)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
    for gen in (True, False):
        assert render(shipped, msgs, None, generation_prompt=gen) == render(tools, msgs, None, generation_prompt=gen)


@pytest.mark.parametrize("kind, template", [("tiny", TINY_TOOLS), ("qwen", QWEN25)])
def test_an_sft_row_in_openai_layout_encodes_as_the_engine_rolls_it_out(kind, template, scripted_backend_cls):
    tok = tokenizer(kind, template)
    env = RetoolEnv(PROBLEM, None, RetoolConfig(tool_format="hermes", prompt="short"))
    call = {"function": {"name": "python", "arguments": {"code": "print(6*7)"}}}
    row = {
        "tools": env.tools,
        "messages": env.initial_messages()
        + [
            {"role": "assistant", "content": "<think>\nMultiply with code.\n</think>\n", "tool_calls": [call]},
            {"role": "tool", "name": "python", "content": "42"},
            {"role": "assistant", "content": FINAL},
        ],
    }
    sft = encode_record(row, tok)
    sft.check()
    engine, _ = engine_for(tok, [CALL_1, FINAL + "<EOS>"], scripted_backend_cls)
    try:
        (traj,), _ = engine.run([PROBLEM])
    finally:
        engine.close()
    assert sft.prompt_ids == traj.prompt_ids
    assert sft.response_ids == traj.response_ids and sft.loss_mask == traj.loss_mask
    # The mask covers exactly the assistant's text (tool call included) and the final EOS.
    trained = tok.decode([i for i, m in zip(sft.response_ids, sft.loss_mask) if m])
    assert trained == CALL_1 + FINAL + tok.eos_token


def test_a_turn_cut_by_the_budget_is_not_run(scripted_backend_cls):
    tok = tokenizer("tiny", TINY_TOOLS)
    engine, _ = engine_for(tok, [CALL_1, FINAL + "<EOS>"], scripted_backend_cls, max_new_tokens_per_turn=10)
    try:
        (traj,), stats = engine.run([PROBLEM])
    finally:
        engine.close()
    assert traj.finish_reason == "max_tokens" and traj.tool_calls == 0


def test_the_sft_traces_key_is_unchanged_at_the_default_format():
    from stare_tir.sft.stage import traces_inputs
    from stare_tir.train_config import TrainConfig

    cfg = TrainConfig()
    assert "tool_format" not in traces_inputs(cfg)["env"]  # keys made before formats existed still match
    cfg.env.tool_format = "hermes"
    assert traces_inputs(cfg)["env"]["tool_format"] == "hermes"  # hermes traces are other traces


def test_malformed_calls_cost_turns_until_max_turns_and_are_counted(scripted_backend_cls):
    tok = tokenizer("tiny", TINY_TOOLS)
    engine, _ = engine_for(tok, [BAD_CALL], scripted_backend_cls, max_turns=3)
    try:
        (traj,), stats = engine.run([PROBLEM])
    finally:
        engine.close()
    traj.check()
    assert traj.finish_reason == "max_turns" and traj.num_turns == 3 and traj.tool_calls == 0
    assert stats["rollout/tool_format_errors"] == 3 and stats["rollout/error_rate"] == 0
    assert tok.decode(traj.response_ids).count("Error: the tool call is not valid JSON") == 2  # read twice


def test_a_mid_run_rewrite_of_the_models_turn_ends_that_trajectory_as_an_error(scripted_backend_cls, tmp_path):
    # Passes the start-up probe (its turns have no outer whitespace), but trims what the model wrote.
    text = TINY_TOOLS.read_text().replace(
        "'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n'",
        "'<|im_start|>' + message.role + '\\n' + (message.content | trim) + '<|im_end|>\\n'",
    )
    assert text != TINY_TOOLS.read_text()
    (tmp_path / "trims.jinja").write_text(text)
    tok = tokenizer("tiny", tmp_path / "trims.jinja")
    check_tool_template(tok, make_tool_format("hermes"), "trims.jinja")
    engine, backend = engine_for(tok, ["\n" + CALL_1, FINAL + "<EOS>"], scripted_backend_cls)
    try:
        (traj,), stats = engine.run([PROBLEM])
    finally:
        engine.close()
    assert traj.finish_reason == "error" and traj.infra_failure and "not prefix-preserving" in traj.info["error"]
    assert len(backend.calls) == 1 and traj.turns == [(0, len(traj.response_ids), "model")]  # no tool turn appended


def test_qwen3_keeps_think_blocks_inside_the_tool_loop_and_a_respaced_one_is_an_error(scripted_backend_cls):
    """Qwen3's template passes the check (within one user query it keeps earlier <think> blocks; the
    turn-boundary test above runs it too), but it re-renders a <think> block from its parts: a turn
    whose block is not spaced its way would be conditioned on other text than the template renders,
    so that trajectory ends as an error instead of being trained on."""
    tok = tokenizer("qwen", QWEN3)
    check_tool_template(tok, make_tool_format("hermes"), str(QWEN3))
    squeezed = CALL_1.replace("<think>\n", "<think>").replace("\n</think>\n\n", "</think>\n")
    assert squeezed != CALL_1
    engine, _ = engine_for(tok, [squeezed, FINAL + "<EOS>"], scripted_backend_cls)
    try:
        (traj,), _ = engine.run([PROBLEM])
    finally:
        engine.close()
    assert traj.finish_reason == "error" and "not prefix-preserving" in traj.info["error"]
