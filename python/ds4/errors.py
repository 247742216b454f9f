"""Exceptions raised by ds4.

Every failure the library can foresee (a bad file, a wrong shape, a full context) raises one of
these, never a crash. All derive from :class:`Ds4Error`::

    >>> import ds4
    >>> issubclass(ds4.errors.ModelFormatError, ds4.errors.Ds4Error)
    True
"""

from __future__ import annotations

__all__ = [
    "Ds4Error",
    "ModelFormatError",
    "UnsupportedModelError",
    "ContextOverflowError",
    "CacheFormatError",
    "InvalidArgumentError",
    "TokenizerError",
    "CancelledError",
    "Ds4IOError",
    "SessionBusyError",
    "Ds4MemoryError",
    "PipelineError",
    "SteeringFileError",
    "LogitsFileError",
]


class Ds4Error(Exception):
    """Base class of every error ds4 raises on purpose."""


class ModelFormatError(Ds4Error, ValueError):
    """A model file is malformed or does not match the layout its metadata declares.

    The message names the file, the key or tensor, what was found and what was expected.
    """


class UnsupportedModelError(Ds4Error):
    """A well-formed file that ds4 cannot run (another architecture, an unknown quant type...)."""


class ContextOverflowError(Ds4Error):
    """More tokens than the session's context size. The session stays usable."""


class CacheFormatError(Ds4Error, ValueError):
    """A session payload or KV cache file is truncated, corrupt or written for another model/context."""


class InvalidArgumentError(Ds4Error, ValueError):
    """A call got arguments of the wrong size, type or range (e.g. a token id outside the vocabulary)."""


class TokenizerError(Ds4Error, ValueError):
    """The tokenizer metadata is missing or inconsistent, or an id cannot be decoded."""


class CancelledError(Ds4Error):
    """A long call (prefill) was cancelled (between layers or chunks); the session keeps the chunks that
    finished and is consistent."""


class Ds4IOError(Ds4Error, OSError):
    """The operating system refused a read, write or memory map."""


class SessionBusyError(Ds4Error, RuntimeError):
    """A session was entered while another call was inside it (another thread, or a mutating call
    from its own progress callback). Sessions serve one call at a time: use one per thread."""


class Ds4MemoryError(Ds4Error, MemoryError):
    """The core could not allocate what a call needs (a context or batch too large for the machine)."""


class PipelineError(Ds4Error):
    """A pipeline stage on another process or machine died, did not answer in time, or could not be
    placed (or Ray, which runs the stages, is not installed). The message names the stage; resume
    the conversation on a new pipeline from a saved payload or the disk KV cache."""


class SteeringFileError(InvalidArgumentError):
    """A directional-steering file of the wrong size for the model, or holding non-finite values."""


class LogitsFileError(Ds4Error, ValueError):
    """A saved-logits file (``ds4 perplexity --save-logits``) is corrupt, truncated or does not match
    the run it is compared with (vocabulary, window, tokens)."""
