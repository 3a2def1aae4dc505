"""Special-token texts of the DeepSeek-V4 prompt and output format (see shared/spec/dsv4-chat-format.md).

The bar is U+FF5C (fullwidth) and `▁` is U+2581; every string below is a single token of the V4
tokenizer.
"""
from __future__ import annotations

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
LATEST_REMINDER = "<｜latest_reminder｜>"
THINK_START = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"

# The two newlines belong to the marker: a block preceded by one newline is not a tool-call block.
TOOL_CALLS_START = f"\n\n<{DSML}tool_calls"
TOOL_CALLS_END = f"</{DSML}tool_calls>"
INVOKE_START = f"<{DSML}invoke"
INVOKE_END = f"</{DSML}invoke>"
PARAMETER_START = f"<{DSML}parameter"
PARAMETER_END = f"</{DSML}parameter"  # the closing '>' is checked separately (values may end in '<')
