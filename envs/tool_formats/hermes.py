"""Native tool calling in the Qwen2.5 / Qwen3 ("Hermes") convention.

The tools' JSON schemas go to the chat template (`apply_chat_template(..., tools=HERMES_TOOLS)`),
which shows them in the system turn. The model calls the one tool, `python`, as

    <tool_call>
    {"name": "python", "arguments": {"code": "print(6 * 7)"}}
    </tool_call>                  <- generation stops here

and reads the result as a `tool` message, rendered by its own chat template (Qwen2.5: a user turn
holding `<tool_response>\\n42\\n</tool_response>`). The engine appends exactly the tokens the
template renders for that message given the conversation so far (stare_tir/rollout/chat_turns.py).

A call that cannot run (invalid JSON, another tool's name, no `code` argument) is answered with a
one-line error as the tool's output, as verl's and TRL's tool loops do; the env counts it in
`format_errors` (metric `rollout/tool_format_errors`).
"""

from __future__ import annotations

import json
import re

from envs.tool_formats.base import TOOL_FORMATS, ToolCall, neutralize
from envs.tool_formats.retool import RetoolFormat  # noqa: F401  (registered first, whoever imports this)

TOOL_NAME = "python"
HERMES_TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Run a Python script; returns what it prints.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    }
]
HERMES_SYSTEM_PROMPT = (
    "Solve the following problem step by step. You may call the python tool to run code: it runs in a "
    "sandbox and what it prints is returned to you. Write each piece of code as a complete script, "
    "including its imports.\nEnd your response with the final answer in this format:\n"
    "<answer>\n\\boxed{final answer}\n</answer>"
)
HERMES_SHORT_PROMPT = "Call python to compute. Answer in \\boxed{}."
# How an error message shows a well-formed call (no tags: the observation breaks tags apart).
EXAMPLE_CALL = '{"name": "python", "arguments": {"code": "print(1 + 1)"}} inside the tool_call tags'

# What printed output must never carry to the model verbatim: our tags and the template's.
_TAGS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
)
_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_RESPONSE_RE = re.compile(r"<tool_response>.*?(?:</tool_response>|$)", re.DOTALL)


@TOOL_FORMATS.register("hermes")
class HermesFormat:
    """`<tool_call>` JSON calls, `tool` messages rendered by the chat template (module docstring)."""

    name = "hermes"
    stop_strings = ("</tool_call>",)
    chat_turns = True
    tools = HERMES_TOOLS
    call_tags = ("<tool_call>", "</tool_call>")
    system_prompts = {"retool": HERMES_SYSTEM_PROMPT, "short": HERMES_SHORT_PROMPT}

    def find_call(self, turn_text: str) -> ToolCall | None:
        calls = list(_CALL_RE.finditer(turn_text))
        if not calls:
            return None
        pos, body = calls[-1].start(), calls[-1].group(1).strip()
        try:
            call = json.loads(body)
        except json.JSONDecodeError as e:
            return ToolCall("", pos, f"Error: the tool call is not valid JSON ({e.msg}); write {EXAMPLE_CALL}")
        if not isinstance(call, dict):
            return ToolCall("", pos, f"Error: the tool call must be a JSON object; write {EXAMPLE_CALL}")
        name = call.get("name")
        if name != TOOL_NAME:
            return ToolCall("", pos, f"Error: unknown tool {name!r}; the only tool is {TOOL_NAME!r}")
        args = call.get("arguments")
        if isinstance(args, str):  # the OpenAI wire layout sends arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        if not isinstance(args, dict) or not isinstance(args.get("code"), str):
            return ToolCall("", pos, 'Error: the python tool needs the arguments {"code": "<python script>"}')
        return ToolCall(args["code"], pos)

    def observation(self, output: str) -> str:
        return neutralize(output, _TAGS)

    def model_text(self, response_text: str) -> str:
        return _RESPONSE_RE.sub("", response_text)

    def assistant_text(self, message: dict) -> str:
        parts = [message["content"]] if message.get("content") else []
        for call in message.get("tool_calls") or []:
            fn = call.get("function", call)
            args = fn.get("arguments")
            if isinstance(args, str):
                args = json.loads(args)
            # The Qwen2.5 template's own layout: '{"name": "' + name + '", "arguments": ' + tojson + '}'
            parts.append(
                '<tool_call>\n{"name": "'
                + str(fn["name"])
                + '", "arguments": '
                + json.dumps(args, ensure_ascii=False)
                + "}\n</tool_call>"
            )
        return "\n".join(parts)
