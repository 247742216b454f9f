"""DeepSeek V4 chat: the prompt template (:mod:`ds4.chat_template`) and the DSML tool-call parser of
model output (:mod:`ds4.dsml`), byte-for-byte as upstream (RUNTIME.md §2, §8). This module
re-exports both.

Two renderers, as upstream has:

* ``render(messages, tools=..., think=..., ctx=...)``: the server's text template (§2.3-§2.6),
  returning the rendered string and, given a tokenizer, its rendered-chat tokens.
* ``encode_chat_prompt`` / ``append_message`` / ``append_assistant_prefix``: the engine-level token
  rendering (§2.2) that the CLI uses, where each text part is BPE-encoded separately.

Messages are OpenAI-style mappings: ``{"role", "content", "reasoning_content" (or "reasoning"),
"tool_calls": [{"id", "function": {"name", "arguments"}}], "raw_dsml"}``.

Example::

    >>> render([{"role": "user", "content": "Hello"}], think="none").text
    '<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜></think>'
"""

from __future__ import annotations

from .chat_template import *  # noqa: F401,F403  (rendering: the prompt template)
from .chat_template import __all__ as _template_all
from .dsml import *  # noqa: F401,F403  (parsing: DSML tool calls in model output)
from .dsml import __all__ as _dsml_all

__all__ = [*_template_all, *_dsml_all]
