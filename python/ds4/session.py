"""``ds4.Session``: one mutable inference timeline over an :class:`~ds4.engine.Engine`.

A session owns its KV state (raw sliding window, compressed rows, compressor frontiers) and the
logits for the next token. ``sync`` reuses whatever prefix is already evaluated::

    >>> import ds4, ds4.testing
    >>> s = ds4.Engine(ds4.testing.default_model_path(), threads=1).session(ctx=128)
    >>> s.sync([5, 6, 7]); s.pos
    3
    >>> t = s.argmax(); s.eval(t); s.pos
    4
    >>> snap = s.snapshot(); s.eval(9); s.restore(snap); s.pos
    4
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from ._atomic import write_atomic
from ._args import MAX_CTX, check_int
from .errors import InvalidArgumentError, UnsupportedModelError

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine
    from .sampling import Rng, TokenLogprob
    from .steering import Steering

__all__ = ["Session", "Snapshot", "ActivationCapture", "common_prefix_len"]


def common_prefix_len(a: Iterable[int], b: Iterable[int]) -> int:
    """Length of the common prefix of two token sequences: :meth:`Session.common_prefix` for
    session doubles written in Python (the reference engine's session, test fakes)."""
    n = 0
    for x, y in zip(a, b):
        if x != int(y):
            break
        n += 1
    return n


@dataclass(frozen=True)
class Snapshot:
    """An in-memory checkpoint of a whole session (its DSV4 payload bytes)."""

    payload: bytes
    pos: int
    ctx: int

    @property
    def nbytes(self) -> int:
        return len(self.payload)


ProgressFn = Callable[[int, int], None]


class ActivationCapture:
    """What :meth:`Session.capture` recorded: per component a float32 ``[tokens, n_layer, n_embd]``
    array (``capture["ffn_out"]``) and the tokens' positions. Filled when the ``with`` block ends."""

    def __init__(self, components: tuple[str, ...]) -> None:
        self.components = components
        self.positions = np.zeros(0, np.int64)
        self.values: dict[str, np.ndarray] = {}

    def __getitem__(self, component: str) -> np.ndarray:
        try:
            return self.values[component]
        except KeyError:
            raise InvalidArgumentError(f"{component!r} was not captured (captured: {', '.join(self.components)})") from None

    def __repr__(self) -> str:
        return f"ActivationCapture({', '.join(self.components)}; {len(self.positions)} tokens)"


class _CaptureScope:
    def __init__(self, session: "Session", capture: ActivationCapture, mask: int, last_only: bool) -> None:
        self._s, self.capture, self._mask, self._last_only = session, capture, mask, last_only

    def __enter__(self) -> ActivationCapture:
        if self._s._capturing:
            raise InvalidArgumentError("this session is already capturing activations")
        self._s._s.set_tap(self._mask, self._last_only)
        self._s._capturing = True
        return self.capture

    def __exit__(self, *exc: object) -> None:
        from .steering import COMPONENTS
        positions, rows = self._s._s.take_tap()
        self._s._s.set_tap(0, False)
        self._s._capturing = False
        self.capture.positions = positions
        self.capture.values = {COMPONENTS[k]: v for k, v in rows.items()}


class Session:
    """One timeline: ``sync``/``eval`` tokens, read ``logits``, checkpoint and persist the state.

    One call at a time: use one session per thread (sessions of one engine may run concurrently).
    A call made while another is inside the session (from another thread, or a state-changing call
    from its own progress callback) raises :class:`~ds4.errors.SessionBusyError`.
    Long calls release the GIL; Ctrl-C or :meth:`cancel` from another thread stops a prefill within
    a layer or two (a fraction of a second), leaving the session consistent at the last finished
    chunk boundary.
    """

    def __init__(self, engine: "Engine", ctx: int = 32768) -> None:
        ctx = check_int(ctx, "ctx", 2, MAX_CTX)
        self.engine = engine
        # The compiled session of a local engine, or a pipeline's chain of stages (same methods).
        self._s = engine._core_session(ctx)
        self._native = type(self._s).__module__ == "ds4._core"
        self._logits: np.ndarray | None = None
        self._steering: Steering | None = None
        self._capturing = False

    # ---- timeline ---------------------------------------------------------------------------
    @property
    def pos(self) -> int:
        """Number of tokens in the timeline (the position the next token gets)."""
        return int(self._s.pos)

    @property
    def ctx(self) -> int:
        return int(self._s.ctx)

    @property
    def tokens(self) -> list[int]:
        """The tokens whose state is live, in order."""
        return list(self._s.tokens)

    def sync(self, tokens: Iterable[int], progress: ProgressFn | None = None) -> None:
        """Make the timeline exactly ``tokens`` (1 <= len < ctx), evaluating only what is new.

        If the current tokens are a prefix of ``tokens`` only the suffix is evaluated, otherwise
        the state is rebuilt. ``progress(done, total)`` is called after each prefill chunk.
        """
        if not self._native:   # the compiled session checks each id itself, without a Python loop
            tokens = [check_int(t, "token") for t in tokens]
        self._s.sync(tokens, progress)

    def eval(self, token: int) -> None:
        """Append one token and refresh the logits (ContextOverflowError when ctx is full)."""
        self._s.eval(check_int(token, "token"))

    def eval_with_mtp(self, token: int) -> None:
        """:meth:`eval`, plus the MTP's guess of the token after it (step 0, what :meth:`mtp_logits`
        computes next) in the same pass: the two output heads share one read of the head's
        weights, so the guess costs the MTP layer rather than a second pass over the head.
        The state is byte for byte that of eval() then mtp_logits()."""
        if not self.engine.has_mtp:
            raise UnsupportedModelError("this engine has no MTP block loaded (pass mtp_path=...)")
        fused = getattr(self._s, "eval_with_mtp", None)   # a pipeline's timeline has no fused step
        if fused is None:
            self.eval(token)
            return
        fused(check_int(token, "token"))

    def rewind(self, pos: int) -> None:
        """Truncate the timeline to its first ``pos`` tokens (the state is rebuilt on next use)."""
        self._s.rewind(check_int(pos, "rewind position"))

    def reset(self) -> None:
        """Drop everything: an empty timeline."""
        self._s.reset()

    def common_prefix(self, tokens: Iterable[int]) -> int:
        """Length of the common prefix of the live tokens and ``tokens``."""
        return int(self._s.common_prefix(tokens))

    def cancel(self) -> None:
        """Ask a running ``sync`` (in another thread) to stop: it raises CancelledError within a layer or
        a 64-token group, and the session keeps the tokens of the chunks that finished."""
        self._s.cancel()

    # ---- outputs ----------------------------------------------------------------------------
    @property
    def logits(self) -> np.ndarray:
        """Read-only float32 view (vocab,) of the next-token logits; updated in place by eval."""
        if self._logits is None:
            self._logits = self._s.logits_view()
        else:
            self._s.logits_view()  # rebuilds a rewound state; the view itself never moves
        return self._logits

    def argmax(self) -> int:
        """The most likely next token (lowest id on ties)."""
        return int(self._s.argmax())

    def sample(self, temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
               min_p: float | None = None, rng: "Rng | None" = None) -> int:
        """Sample the next token from the current logits (:func:`ds4.sampling.sample`; defaults
        are upstream's). ``temperature <= 0`` is argmax and needs no ``rng``."""
        from . import sampling
        kw = {k: v for k, v in dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p).items()
              if v is not None}
        return sampling.sample(self.logits, rng=rng, engine=self.engine, **kw)

    def top_logprobs(self, k: int) -> list["TokenLogprob"]:
        """The k most likely next tokens with their log-probabilities (:func:`ds4.sampling.top_logprobs`)."""
        from . import sampling
        return sampling.top_logprobs(self.logits, k)

    # ---- checkpoints --------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """An in-memory checkpoint of the whole state."""
        return Snapshot(self._s.save_payload(), self.pos, self.ctx)

    def restore(self, snap: Snapshot) -> None:
        """Go back to ``snap`` (taken from a session with a compatible ctx)."""
        self.load_payload(snap.payload)

    def save_payload(self) -> bytes:
        """The DSV4 session payload (docs/runtime.md §6.1), byte-compatible with upstream."""
        return self._s.save_payload()

    def load_payload(self, data: bytes | bytearray | memoryview) -> None:
        """Replace the state with a payload; CacheFormatError (session unchanged) if it does not fit.

        ``data`` is any C-contiguous bytes-like object; it is validated against the model (so a
        payload from another model shape says so) before the core reads it.
        """
        try:
            mv = memoryview(data)
        except TypeError:
            raise InvalidArgumentError(f"session payload must be bytes-like, got {type(data).__name__}") from None
        if not mv.c_contiguous:
            raise InvalidArgumentError("session payload must be a contiguous buffer "
                                       "(bytes, bytearray or a C-contiguous view)")
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        self.engine.check_payload(mv)
        self._s.load_payload(mv)

    def payload_size(self) -> int:
        return int(self._s.payload_size())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the payload to ``path`` atomically (unique temp file in the same folder, fsync, rename).

        Raises :class:`~ds4.errors.Ds4IOError` naming the file if the OS refuses; no temp file is left."""
        from .errors import Ds4IOError
        try:
            write_atomic(Path(path), [self.save_payload()])
        except OSError as e:
            raise Ds4IOError(f"{path}: cannot write session file: {e.strerror or e}") from e

    @property
    def kv_bytes(self) -> int:
        """Bytes allocated for this session's KV state."""
        return int(self._s.kv_bytes)

    # ---- steering and activations --------------------------------------------------------------
    def _hooks(self, what: str):
        """The compiled session's hook API (a pipeline's chain of stages has none yet)."""
        if not hasattr(self._s, "set_tap"):
            raise UnsupportedModelError(f"{what} needs a single-engine session; pipeline stages do not run it yet")
        return self._s

    @property
    def steering(self) -> "Steering | None":
        """Directional steering of this session (None: off); see :mod:`ds4.steering`.

        Setting it on a non-empty timeline keeps the tokens and rebuilds their state under the
        new setting on next use (the live state was computed under the old one).
        """
        return self._steering

    @steering.setter
    def steering(self, value: "Steering | None") -> None:
        core = self._hooks("directional steering")
        native = None
        if value is not None:
            value = value.for_shape(self.engine.shape)
            native = value._native(self.engine.shape)
        core.set_steering(native)
        self._steering = value

    def capture(self, *components: str, last_only: bool = False) -> _CaptureScope:
        """Record per-layer activations of every token evaluated inside a ``with`` block::

            with s.capture("ffn_out") as cap:
                s.sync(tokens)
            cap["ffn_out"]          # float32 [tokens, n_layer, n_embd]

        Components: ``"attn_out"`` (attention output after its projection) and ``"ffn_out"``
        (routed + shared experts), as HC post consumes them, i.e. after any steering edit.
        ``last_only`` keeps only the last evaluated token (bounded memory on long prompts).
        Tokens rebuilt after a rewind are recorded again, with their positions.
        """
        from .steering import COMPONENTS
        self._hooks("the activation tap")
        comps = components or ("ffn_out",)
        mask = 0
        for c in comps:
            if c not in COMPONENTS:
                raise InvalidArgumentError(f"unknown activation component {c!r}; expected one of {', '.join(COMPONENTS)}")
            mask |= 1 << COMPONENTS.index(c)
        return _CaptureScope(self, ActivationCapture(tuple(comps)), mask, bool(last_only))

    # ---- MTP ----------------------------------------------------------------------------------
    def mtp_logits(self) -> np.ndarray:
        """MTP step-0 logits (float32 copy, vocab): the MTP block's guess of the next token, the one
        the target's :attr:`logits` choose (upstream checks the two agree before drafting further).

        One MTP step (docs/model.md §3.12) from the last evaluated token and its final hidden state, run
        once per position on first request; the MTP block's own 128-token window gets a row per
        step taken, so call it after every eval when drafting continuously.
        """
        if not self.engine.has_mtp:
            raise UnsupportedModelError("this engine has no MTP block loaded (pass mtp_path=...)")
        return self._s.mtp_logits()

    def mtp_draft(self) -> int:
        """The MTP block's greedy guess of the next token (the argmax of :meth:`mtp_logits`, lowest
        id on ties; speculation compares it with the token it is about to commit,
        docs/speculative.md)."""
        top = getattr(self._s, "mtp_top", None)   # a pipeline's timeline has only mtp_logits
        if top is None:
            from .sampling import argmax
            return argmax(self.mtp_logits())
        if not self.engine.has_mtp:
            raise UnsupportedModelError("this engine has no MTP block loaded (pass mtp_path=...)")
        return int(top())

    # ---- speculative decoding (docs/speculative.md) ---------------------------------------------
    @property
    def supports_speculative(self) -> bool:
        """Whether this session can verify drafts in one pass (a local engine's session can; a
        pipeline of stages cannot yet: its stages have no verification pass)."""
        return hasattr(self._s, "verify")

    def _need_speculative(self) -> None:
        if not self.supports_speculative:
            raise UnsupportedModelError("speculative decoding needs a single-engine session; pipeline stages do not "
                                        "run it yet (use ds4.Engine, or speculative=0)")

    @property
    def max_verify(self) -> int:
        """Most tokens one :meth:`verify` takes here (the raw window, and one context slot stays free)."""
        self._need_speculative()
        return int(self._s.max_verify())

    def verify(self, tokens: Iterable[int]) -> np.ndarray:
        """Evaluate ``tokens`` at :attr:`pos` in one batched pass without committing them.

        Returns the logits after each prefix (float32 array (len, vocab); row i follows
        ``tokens[:i + 1]``). Follow with :meth:`accept`; any other call discards the pass first.
        """
        self._need_speculative()
        return self._s.verify(list(tokens))

    def accept(self, count: int) -> None:
        """Commit the first ``count`` verified tokens; the state, logits and hidden state are then
        exactly what :meth:`eval` of those tokens leaves (byte-identical payload)."""
        self._need_speculative()
        self._s.accept(int(count))

    def speculate(self, first: int, drafts: Iterable[int]) -> int:
        """Greedy speculation: commit ``first`` plus the longest prefix of ``drafts`` that greedy
        decode would produce, verified in one batched pass. Returns how many tokens were committed
        (>= 1); the logits then give the next greedy token."""
        self._need_speculative()
        return int(self._s.speculate_greedy(int(first), list(drafts)))

    def mtp_drafts(self, first: int, n: int, stop: int | None = None, margin: float | None = None) -> list[int]:
        """Up to ``n`` greedy MTP drafts for the tokens after ``first`` (the token about to be
        committed), stopping after ``stop`` if drafted (needs MTP weights). With ``margin``, the
        chain ends before the first draft whose step's top-1 minus top-2 logit is below it
        (:func:`ds4.speculative.logit_margin`; upstream's ``--mtp-margin`` gate)."""
        if not self.engine.has_mtp:
            raise UnsupportedModelError("this engine has no MTP block loaded (pass mtp_path=...)")
        floor = float("-inf") if margin is None else float(margin)
        return list(self._s.mtp_drafts(int(first), int(n), -1 if stop is None else int(stop), floor))

    def mtp_draft_step(self, token: int) -> np.ndarray:
        """One step of the MTP draft chain (float32 logits copy): the first call after a commit
        feeds the token about to be committed, later calls the previous draft."""
        if not self.engine.has_mtp:
            raise UnsupportedModelError("this engine has no MTP block loaded (pass mtp_path=...)")
        return self._s.mtp_draft_step(int(token))

    def __repr__(self) -> str:
        return f"Session(pos={self.pos}, ctx={self.ctx})"
