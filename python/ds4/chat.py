"""DeepSeek V4 chat, byte-for-byte as upstream (docs/runtime.md §2, §8): the prompt template
(:mod:`ds4.chat_template`: ``render``, ``render_completion``, the engine-level token rendering) and
the DSML tool-call parser of model output (:mod:`ds4.dsml`). This module re-exports both."""

from __future__ import annotations

from .chat_template import *  # noqa: F401,F403  (rendering: the prompt template)
from .chat_template import __all__ as _template_all
from .dsml import *  # noqa: F401,F403  (parsing: DSML tool calls in model output)
from .dsml import __all__ as _dsml_all

__all__ = [*_template_all, *_dsml_all]
