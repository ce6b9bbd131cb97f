"""Tool formats: how the model writes a tool call and reads its result (see base.py)."""

from envs.tool_formats.base import TOOL_FORMATS, ToolCall, ToolFormat, make_tool_format

__all__ = ["TOOL_FORMATS", "ToolCall", "ToolFormat", "make_tool_format"]
