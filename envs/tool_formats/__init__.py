"""Tool formats: how the model writes a tool call and reads its result (see base.py).

The built-in formats are imported here, in a fixed order, so the registry lists them the same way
whichever module is imported first (`--help`, the configuration reference)."""

from envs.tool_formats import hermes, retool  # noqa: F401  (registers both, in this order)
from envs.tool_formats.base import TOOL_FORMATS, ToolCall, ToolFormat, make_tool_format

__all__ = ["TOOL_FORMATS", "ToolCall", "ToolFormat", "make_tool_format"]
