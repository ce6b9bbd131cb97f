"""Retool's text tags, the default tool format (DESIGN.md "Retool conventions").

    <code>
    ```python
    print(6 * 7)
    ```
    </code>                       <- generation stops here
    \\n<interpreter>\\n42\\n</interpreter>\\n   <- appended verbatim as plain text

The parsing and the observation text are envs/retool.py's own functions, so this format is that
env's behaviour byte for byte.
"""

from __future__ import annotations

from envs.tool_formats.base import TOOL_FORMATS, ToolCall


@TOOL_FORMATS.register("retool")
class RetoolFormat:
    """`<code>` blocks in plain text, `<interpreter>` observations (see module docstring)."""

    name = "retool"
    stop_strings = ("</code>",)
    chat_turns = False
    tools: list[dict] = []
    call_tags = ("<code>", "</code>")

    def __init__(self) -> None:
        from envs.retool import PROMPTS

        self.system_prompts = dict(PROMPTS)

    def find_call(self, turn_text: str) -> ToolCall | None:
        from envs.retool import extract_code

        code, pos = extract_code(turn_text)
        return None if code is None else ToolCall(code, pos)

    def observation(self, output: str) -> str:
        from envs.retool import neutralize

        return f"\n<interpreter>\n{neutralize(output)}\n</interpreter>\n"

    def model_text(self, response_text: str) -> str:
        from envs.retool import strip_interpreter

        return strip_interpreter(response_text)

    def assistant_text(self, message: dict) -> str:
        if message.get("tool_calls"):
            raise ValueError("the retool format writes code in the assistant text, not as tool_calls")
        return str(message.get("content") or "")
