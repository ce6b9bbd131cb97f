"""Tool turns rendered by the model's own chat template, token-in/token-out.

For a chat tool format (`env.tool_format=hermes`) the tokens appended after a model turn are exactly
the suffix the chat template renders for the `tool` message given the conversation so far:

    before = prompt text + every model turn and tool turn so far, as the model was conditioned on it
    after  = apply_chat_template(messages + [tool message], tools=..., add_generation_prompt=True)
    tool turn tokens = tokenize(after[len(before):])        # after must start with before

The model's own turns enter `messages` as the assistant content they decoded to (tool call
included, `<think>` blocks kept as generated) and are never re-tokenized: their ids are the ids the
backend sampled. The suffix holds the template's control tokens (`<|im_end|>`, `<|im_start|>`),
which must become their special ids; the tool output inside it was neutralized by the format, so
nothing printed by code can become a control token.

This is exact only for a template that is prefix-preserving: rendering a longer conversation
leaves the rendering of its earlier turns as it was. `check_tool_template` renders a probe
conversation turn by turn and whole at start and refuses, in one line naming the template and the
first differing position, a template that is not (one that drops or rewrites earlier `<think>`
blocks, or tokenizes a turn boundary differently), and one that cannot show tools to the model at
all (a bare ChatML loop such as SmolLM2's). A template that passes the probe but rewrites some other
turn during a rollout raises `TemplateError` there: that trajectory ends as an error, never trained.
"""

from __future__ import annotations

from typing import Any

from stare_tir.errors import StartupError
from stare_tir.model import TINY_TEMPLATES

# The probe of the start-up check: a thinking model's tool call, its result, the final answer.
PROBE_THINK_1 = "<think>\nI should multiply 6 by 7 with code.\n</think>\n\nLet me run it."
PROBE_CODE = "print(6 * 7)"
PROBE_OUTPUT = "42"
PROBE_FINAL = "<think>\nThe tool printed 42.\n</think>\n\nThe answer is \\boxed{42}."


class TemplateError(StartupError):
    """The chat template cannot serve a chat tool format (one line: which template, what, where).
    A user-fixable start-up error: the console prints it alone, exit status 2."""


def render(tokenizer: Any, messages: list[dict], tools: list[dict] | None, *, generation_prompt: bool) -> str:
    kwargs = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)


def encode_template_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of template-rendered text: its control strings become their special ids."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _first_difference(a: str | list, b: str | list) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _around(text: str, pos: int) -> str:
    return repr(text[max(0, pos - 30) : pos + 30])


class ChatTurns:
    """One trajectory's conversation as its chat template renders it (see module docstring).

    tokenizer: the policy's tokenizer (its chat_template); messages: the env's initial messages;
    tools: the format's JSON schemas; template: the template's name for messages.
    """

    def __init__(self, tokenizer: Any, messages: list[dict], tools: list[dict], template: str = "") -> None:
        self.tokenizer = tokenizer
        self.tools = tools
        self.template = template or "of the tokenizer"
        self.messages = [dict(m) for m in messages]
        self.text = render(tokenizer, self.messages, tools, generation_prompt=True)

    def prompt_ids(self) -> list[int]:
        return encode_template_text(self.tokenizer, self.text)

    def model_turn(self, text: str) -> None:
        """Record a model turn: `text` is what its sampled ids decode to (special tokens kept)."""
        self.messages.append({"role": "assistant", "content": text})
        self.text += text

    def tool_turn(self, content: str, name: str = "python") -> list[int]:
        """The ids of the template's rendering of a `tool` message after the conversation so far."""
        messages = [*self.messages, {"role": "tool", "name": name, "content": content}]
        after = render(self.tokenizer, messages, self.tools, generation_prompt=True)
        if not after.startswith(self.text):
            pos = _first_difference(self.text, after)
            raise TemplateError(
                f"chat template {self.template}: not prefix-preserving: appending a tool turn re-renders the "
                f"conversation so far from character {pos} on (conditioned on {_around(self.text, pos)}, "
                f"re-rendered {_around(after, pos)}); use a template that renders earlier turns as they were, "
                "or env.tool_format=retool"
            )
        suffix = after[len(self.text) :]
        self.messages, self.text = messages, after
        return encode_template_text(self.tokenizer, suffix)


def shows_tools(tokenizer: Any, tools: list[dict]) -> bool:
    """Whether the template gives `tools=` to the model at all (renders differently with them)."""
    probe = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    with_tools = render(tokenizer, probe, tools, generation_prompt=True)
    names = [t.get("function", t).get("name", "") for t in tools]
    return with_tools != render(tokenizer, probe, None, generation_prompt=True) and all(n in with_tools for n in names)


def check_tool_template(tokenizer: Any, fmt: Any, template: str = "") -> None:
    """Refuse (TemplateError, one line) a chat template that cannot serve the chat tool format `fmt`:
    one that ignores the tools, or one that is not prefix-preserving on a probe conversation with
    `<think>` blocks, a tool call and a tool turn (text and token ids compared turn by turn and
    whole). A text format (`fmt.chat_turns` false) needs nothing of the template."""
    if not fmt.chat_turns:
        return
    name = template or "of the tokenizer"
    if not shows_tools(tokenizer, fmt.tools):
        raise TemplateError(
            f"chat template {name} cannot call tools (it ignores `tools=`: no tool schema reaches the model): "
            f"set env.tool_format=retool, or model.chat_template=FILE with a template that can "
            f"(the tiny model's: {TINY_TEMPLATES / 'tiny_tools.jinja'})"
        )
    system = {"role": "system", "content": fmt.system_prompts["short"]}
    user = {"role": "user", "content": "What is 6*7?"}
    call = {"function": {"name": fmt.tools[0]["function"]["name"], "arguments": {"code": PROBE_CODE}}}
    first = fmt.assistant_text({"content": PROBE_THINK_1, "tool_calls": [call]})
    turns = ChatTurns(tokenizer, [system, user], fmt.tools, name)
    ids = turns.prompt_ids()
    turns.model_turn(first)
    ids += encode_template_text(tokenizer, first)
    ids += turns.tool_turn(fmt.observation(PROBE_OUTPUT))
    turns.model_turn(PROBE_FINAL)
    ids += encode_template_text(tokenizer, PROBE_FINAL)
    whole_msgs = [
        system,
        user,
        {"role": "assistant", "content": first},
        {"role": "tool", "name": call["function"]["name"], "content": fmt.observation(PROBE_OUTPUT)},
        {"role": "assistant", "content": PROBE_FINAL},
    ]
    whole = render(tokenizer, whole_msgs, fmt.tools, generation_prompt=False)
    if not whole.startswith(turns.text):
        pos = _first_difference(turns.text, whole)
        raise TemplateError(
            f"chat template {name}: not prefix-preserving: the conversation rendered whole differs from its "
            f"turns rendered one by one at character {pos} (turn by turn {_around(turns.text, pos)}, whole "
            f"{_around(whole, pos)}): earlier turns are re-rendered (e.g. <think> blocks dropped), so the tokens "
            "trained on would not be the tokens the model was conditioned on; use a template that keeps earlier "
            "turns as they were, or env.tool_format=retool"
        )
    whole_ids = encode_template_text(tokenizer, whole)[: len(ids)]
    if whole_ids != ids:
        pos = _first_difference(ids, whole_ids)
        raise TemplateError(
            f"chat template {name}: a turn boundary tokenizes differently turn by turn than whole, at token {pos} "
            f"({ids[pos : pos + 3]} vs {whole_ids[pos : pos + 3]}): end each turn with a special token"
        )
