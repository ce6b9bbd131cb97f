"""How a tool call is written by the model and how its result comes back: the tool-format registry.

A tool format is one small object, registered by name in `TOOL_FORMATS` and selected with
`env.tool_format`. The env asks it four things and knows nothing else of the format:

    fmt = TOOL_FORMATS.get("hermes")()
    fmt.stop_strings                     # generation stops here ("</code>", "</tool_call>")
    fmt.find_call(turn_text)             # ToolCall(code, pos, error) of this turn, or None
    fmt.observation(output)              # what the model reads back (text, or a tool message's content)
    fmt.model_text(response_text)        # the response without observations (grading, format checks)

Two kinds exist. A text format (`retool`) returns observation text that the engine appends
verbatim. A chat format (`chat_turns = True`, e.g. `hermes`) gives the tools' JSON schemas to the
chat template (`apply_chat_template(..., tools=fmt.tools)`) and returns the content of a `tool`
message: the engine appends exactly the tokens the model's chat template renders for that message
given the conversation so far (stare_tir/rollout/chat_turns.py), and refuses at start a template
that cannot show tools or that re-renders earlier turns differently.

A malformed call (bad JSON, an unknown tool, missing arguments) is a `ToolCall` with `error` set:
the env returns the error as the observation and counts it (`format_errors`), never raises.

Add a format with one file: a class with these attributes, decorated with
`@TOOL_FORMATS.register("name")`, in a module listed in `load=` below or imported as a plugin.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from registry import Registry


@dataclass(frozen=True)
class ToolCall:
    """One tool call found in a model turn.

    code: the Python source to run ("" when the call is malformed).
    pos: where the call starts in the turn text (an answer after it ends the trajectory).
    error: why the call cannot run (shown to the model as the observation); "" when it can.
    """

    code: str
    pos: int
    error: str = ""


@runtime_checkable
class ToolFormat(Protocol):
    """How one tool-call convention is written, stopped at, and answered (see module docstring)."""

    name: str
    # Generation stops at any of these (the stop string itself is kept in the model's tokens).
    stop_strings: tuple[str, ...]
    # True: observations are `tool` messages rendered by the chat template; False: plain text.
    chat_turns: bool
    # JSON schemas handed to the chat template (`tools=`); empty for text formats.
    tools: list[dict]
    # The opening and closing tags of a call (the env's format check counts them).
    call_tags: tuple[str, str]
    # System prompt per preset (env.prompt: "retool" full instructions, "short" one line).
    system_prompts: dict[str, str]

    def find_call(self, turn_text: str) -> ToolCall | None:
        """The call of this turn (its last one), or None when the turn calls no tool."""
        ...

    def observation(self, output: str) -> str:
        """The observation for the (already truncated) interpreter output."""
        ...

    def model_text(self, response_text: str) -> str:
        """The model-written part of a response: observations removed."""
        ...

    def assistant_text(self, message: dict) -> str:
        """The text the model writes for an assistant message (SFT traces: content and tool calls
        in the OpenAI layout -> the exact characters the model generates in a rollout)."""
        ...


TOOL_FORMATS: Registry[type] = Registry("tool format", load=("envs.tool_formats.retool", "envs.tool_formats.hermes"))


def make_tool_format(name: str) -> ToolFormat:
    """The tool format registered as `name` (an unknown name lists the valid ones)."""
    return TOOL_FORMATS.get(name)()


_SPECIAL_RE = re.compile(r"<(\|[^<>|\s]{1,40}\|)>")  # <|im_end|>, <|im_start|>, <|endoftext|>, ...


def neutralize(text: str, tags: tuple[str, ...]) -> str:
    """Break `tags` and chat control strings (`<|...|>`) by a space, so text printed by code can
    forge neither a tag our parsers read nor a special token the tokenizer would emit."""
    for tag in tags:
        text = text.replace(tag, tag[0] + " " + tag[1:])
    return _SPECIAL_RE.sub(lambda m: "< " + m.group(1) + ">", text)
