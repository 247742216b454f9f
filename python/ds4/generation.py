"""Text generation on top of an engine session: prompt building, sampling loop, streaming events.

``generate(engine, prompt=... | messages=... | tokens=..., ...)`` drives the session API
(``engine.session(ctx=N)``, ``s.sync(tokens)``, ``s.eval(token)``, ``s.logits``, ``s.pos``,
``s.tokens``, ``s.ctx``) and yields dataclass events:

* :class:`TokenEvent` for every generated token (EOS excluded): the token id, the *released* text
  delta (UTF-8 safe across token boundaries; text that could be the start of a stop string is held
  back and released later), and the channel — ``"reasoning"`` before ``</think>`` when the prompt
  opened a ``<think>`` block, else ``"content"``;
* one final :class:`FinishEvent` with the finish reason (``"eos"``, ``"stop"`` for a stop string,
  ``"length"`` for the token budget, ``"context"`` when the context is full), the texts, the tokens,
  usage counts and timings (``FinishEvent.message()`` parses DSML tool calls out of the text).

With ``tools`` (a chat with tool schemas), upstream's server rules apply: a DSML recognizer forces
greedy choices on protocol syntax (tags, attribute headers, JSON punctuation) while parameter
payloads keep the caller's sampling, and a complete tool block after ``</think>`` ends generation
with ``"tool_calls"``. Upstream's other server override (thinking forces T=1, top_p=1, min_p=0.05)
is left to the caller.

Semantics follow upstream (docs/runtime.md §3.7, §9.5, §10.1): EOS is never evaluated nor emitted; stop
strings are matched on the generated text of the current channel and are not emitted; the sampled
token is only evaluated when another token is needed, so a finished session holds the prompt plus
every emitted token but the last (the next ``sync`` evaluates it when the conversation continues).

With ``kv_cache`` (a :class:`ds4.kvcache.KVCache`), the prompt is looked up by its rendered text
(:func:`prompt_text`): the session is restored from the file holding the longest cached prefix and
only the text after it is tokenized and evaluated; the cache's save policy runs as upstream's
server does (docs/runtime.md §7.3-7.4): an ``evict`` store before an unrelated prompt replaces a live
session, a ``cold`` store after a first prompt with no hit, ``continued`` stores at aligned frontiers
during prefill and before decode steps. The ``shutdown`` store is the caller's
(``kv_cache.shutdown(session, engine)`` on a clean exit; pass ``session=`` to keep the session).
Prompts given as ``tokens=`` are looked up in token mode (only files whose token history is a
prefix of them; the tokens are kept exactly). On a miss the prompt's own tokenization is used, so a
run without any hit evaluates exactly what it evaluates without a cache. On a hit the text after
the cached prefix is tokenized on its own, as upstream does: when the prefix ends inside a word
that BPE would have merged across, the tokens (and so the output) can differ from a cold run.

Example::

    >>> for ev in generate(engine, prompt="Hi", max_tokens=8, seed=1):   # doctest: +SKIP
    ...     print(ev.text if isinstance(ev, TokenEvent) else ev.finish_reason, end="")
"""

from __future__ import annotations

import codecs
import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from .chat import (
    ASSISTANT,
    BOS,
    DEFAULT_SYSTEM,
    THINK_END,
    THINK_MAX_PREFIX,
    THINK_START,
    USER,
    DsmlTracker,
    ParsedMessage,
    encode_chat_prompt,
    parse_generated,
    render,
    think_enabled,
    think_mode_for_context,
)
from ._args import check_int
from .decoding import StopMatcher, TokenPicker, ToolBlockWatch
from .errors import ContextOverflowError, InvalidArgumentError, UnsupportedModelError
from .sampling import (
    check_sampling_args,
    DEFAULT_MIN_P,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    Rng,
    SamplingParams,
    TokenLogprob,
    time_seed,
)
from .speculative import DEFAULT_MARGIN, Speculator, check_margin

__all__ = [
    "DEFAULT_CTX",
    "Usage",
    "TokenEvent",
    "FinishEvent",
    "GenerationEvent",
    "build_prompt",
    "prompt_text",
    "generate",
]

DEFAULT_CTX = 32768  # upstream CLI default context

ProgressFn = Callable[[int, int], None]  # progress(done, total) during sync, as Session.sync


@dataclass(frozen=True)
class Usage:
    """Token counts of one generation. ``cached_tokens``: prompt tokens not evaluated because the
    live session or a disk KV cache file already held them."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    drafted_tokens: int = 0    # speculative decoding: tokens drafted, and how many were accepted
    accepted_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TokenEvent:
    """One generated token and the text released with it (may be '' while text is held back).

    ``token`` is None only for the final flush of held-back text before the FinishEvent.
    """

    token: int | None
    text: str
    channel: str  # "reasoning" | "content"
    logprob: float | None = None
    top_logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True)
class FinishEvent:
    """End of generation: why it stopped, what was produced, counts and timings."""

    finish_reason: str  # "eos" | "stop" | "length" | "context" | "tool_calls"
    reasoning: str
    content: str
    tokens: tuple[int, ...]
    usage: Usage
    prompt_seconds: float
    decode_seconds: float
    stop: str | None = None  # the stop string that matched, for finish_reason == "stop"
    raw_text: str = ""  # all generated text as the model wrote it (with </think>), cut at a stop string
    thinking: bool = False  # the prompt opened a <think> block
    cache_source: str = ""  # where usage.cached_tokens came from: "memory" (live session), "disk", or ""

    def message(self) -> ParsedMessage:
        """Reasoning, content and DSML tool calls parsed from ``raw_text`` (upstream's final parser)."""
        return parse_generated(self.raw_text, self.thinking)

    @property
    def text(self) -> str:
        """The visible output: reasoning (if any) then content, without the </think> marker."""
        return self.reasoning + self.content

    @property
    def prefill_tps(self) -> float:
        n = self.usage.prompt_tokens - self.usage.cached_tokens
        return n / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.usage.completion_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


GenerationEvent = TokenEvent | FinishEvent


def build_prompt(
    tokenizer,
    prompt: str | None = None,
    messages: Sequence[Any] | None = None,
    tokens: Sequence[int] | None = None,
    *,
    system: str | None = DEFAULT_SYSTEM,
    tools: Any = None,
    think: str | bool | None = "high",
    ctx: int | None = None,
    raw: bool = False,
) -> list[int]:
    """Prompt tokens from exactly one of ``prompt`` / ``messages`` / ``tokens``.

    * ``tokens``: used as given.
    * ``messages``: the server chat template (``ds4.chat.render``) with ``tools``.
    * ``prompt``: if ``raw``, plain tokenization (no template, no BOS); if it starts with the BOS
      string it is taken as already-rendered chat text (as upstream's CLI does); otherwise one chat
      turn with ``system`` (upstream's ``ds4_encode_chat_prompt``).
    """
    given = [x is not None for x in (prompt, messages, tokens)]
    if sum(given) != 1:
        raise InvalidArgumentError("give exactly one of prompt=, messages= or tokens=")
    if tokens is not None:
        return [int(t) for t in tokens]
    if messages is not None:
        return render(messages, tools=tools, think=think, ctx=ctx, tokenizer=tokenizer).tokens or []
    assert prompt is not None
    if raw:
        return tokenizer.encode(prompt)
    if prompt.startswith("<｜begin▁of▁sentence｜>"):
        return tokenizer.encode_rendered(prompt)
    return encode_chat_prompt(tokenizer, prompt, system=system, think=think, ctx=ctx)


def prompt_text(
    prompt: str | None = None,
    messages: Sequence[Any] | None = None,
    *,
    system: str | None = DEFAULT_SYSTEM,
    tools: Any = None,
    think: str | bool | None = "high",
    ctx: int | None = None,
    raw: bool = False,
) -> str:
    """The rendered text of a ``prompt`` / ``messages`` prompt: the bytes of the tokens
    :func:`build_prompt` returns for the same arguments, without tokenizing anything (the disk KV
    cache looks prompts up by this text, docs/runtime.md §7.2)."""
    if (prompt is None) == (messages is None):
        raise InvalidArgumentError("give exactly one of prompt= or messages=")
    if messages is not None:
        return render(messages, tools=tools, think=think, ctx=ctx).text
    assert prompt is not None
    if raw or prompt.startswith(BOS):
        return prompt
    mode = think_mode_for_context(think, ctx)
    return "".join((BOS, THINK_MAX_PREFIX if mode == "max" else "", system or "", USER, prompt, ASSISTANT,
                    THINK_START if think_enabled(mode) else THINK_END))


def _sync(session, tokens: list[int], progress: ProgressFn | None) -> None:
    if progress is not None:
        try:
            params = inspect.signature(session.sync).parameters
        except (TypeError, ValueError):
            params = {}
        if "progress" in params:
            session.sync(tokens, progress=progress)
            return
    session.sync(tokens)


class _ProgressSession:
    """A session whose every ``sync`` reports progress (the disk cache syncs in several steps and
    knows nothing about progress callbacks)."""

    def __init__(self, session, progress: ProgressFn) -> None:
        self._s, self._progress = session, progress

    def sync(self, tokens, progress: ProgressFn | None = None) -> None:
        _sync(self._s, tokens, progress or self._progress)

    def __getattr__(self, name: str):
        return getattr(self._s, name)


def _prepare_cached(kv_cache, engine, session, prompt, messages, tokens, *, system, tools, think, raw):
    """The disk cache's plan for this prompt (live reuse, evict store, disk hit or cold miss)."""
    if tokens is not None:
        if prompt is not None or messages is not None:
            raise InvalidArgumentError("give exactly one of prompt=, messages= or tokens=")
        exact = [int(t) for t in tokens]
        if not exact:
            raise InvalidArgumentError("the prompt is empty (no tokens)")
        return kv_cache.prepare(session, exact, engine)
    text = prompt_text(prompt, messages, system=system, tools=tools, think=think, ctx=session.ctx, raw=raw)
    if not text:
        raise InvalidArgumentError("the prompt is empty (no tokens)")
    return kv_cache.prepare(
        session, text, engine,
        full_tokens=lambda: build_prompt(engine.tokenizer, prompt, messages, system=system, tools=tools,
                                         think=think, ctx=session.ctx, raw=raw),
    )


def generate(
    engine,
    prompt: str | None = None,
    messages: Sequence[Any] | None = None,
    *,
    tokens: Sequence[int] | None = None,
    max_tokens: int | None = None,
    temperature: float = DEFAULT_TEMPERATURE,
    top_k: int = DEFAULT_TOP_K,
    top_p: float = DEFAULT_TOP_P,
    min_p: float = DEFAULT_MIN_P,
    stop: str | Sequence[str] | None = None,
    seed: int | None = None,
    think: str | bool | None = "high",
    system: str | None = DEFAULT_SYSTEM,
    tools: Any = None,
    raw: bool = False,
    ctx: int | None = None,
    session=None,
    logprobs: int | None = None,
    progress: ProgressFn | None = None,
    dsml: bool | None = None,
    stream: bool = True,
    kv_cache=None,
    speculative: int = 0,
    mtp_margin: float = DEFAULT_MARGIN,
) -> Iterator[GenerationEvent] | FinishEvent:
    """Generate from ``engine``. Returns an iterator of events (``stream=True``) or the FinishEvent.

    ``session``: a live session to continue (its common token prefix with the prompt is reused);
    otherwise a new one of ``ctx`` tokens (default 32768) is created. ``seed=None`` draws a
    time-based seed (upstream's CLI behaviour). ``max_tokens=None`` runs until EOS, a stop string
    or a full context. ``logprobs=k`` attaches the sampled token's logprob and the top-k to events.
    ``dsml`` turns the tool-call rules on or off (default: on when ``tools`` are given).
    ``kv_cache``: a :class:`ds4.kvcache.KVCache` to restore the longest cached prefix from and to
    store checkpoints in (see the module docstring); ``usage.cached_tokens`` and
    ``FinishEvent.cache_source`` say what was reused. The cache lookup (and a disk load) happens
    when ``generate`` is called, like the prompt checks.
    ``speculative=N``: draft up to N tokens per step with the MTP block and verify them in one
    batched pass (docs/speculative.md); greedy output is unchanged token for token, sampled output
    keeps its distribution. ``usage.drafted_tokens`` / ``accepted_tokens`` count the drafts. It
    steps aside (plain decoding) while logprobs, tool-call rules or continued KV checkpoints are on.
    ``mtp_margin``: draft only while the MTP block's top-1 minus top-2 logit is at least this
    (upstream's ``--mtp-margin``, default 3; 0 turns the margin test off); with the back-off after
    misses, drafts that keep failing cost almost nothing (docs/speculative.md, "Policy").
    """
    if speculative and int(speculative) < 0:
        raise InvalidArgumentError(f"speculative must be >= 0, got {speculative}")
    mtp_margin = check_margin(mtp_margin)
    if speculative and not engine.has_mtp:
        raise UnsupportedModelError("speculative decoding drafts with the MTP block: this engine has none "
                                    "(load it with mtp_path=... or use a GGUF that embeds it)")
    if max_tokens is not None:
        max_tokens = check_int(max_tokens, "max_tokens", 0)
    check_sampling_args(temperature, top_k, top_p, min_p)
    if seed is not None:
        seed = check_int(seed, "seed", 0, 2**64 - 1)
    if session is None:
        session = engine.session(ctx=ctx if ctx is not None else DEFAULT_CTX)
    if speculative and not session.supports_speculative:
        raise UnsupportedModelError("speculative decoding is not available on a pipeline of stages "
                                    f"({type(engine).__name__}): use a single ds4.Engine, or speculative=0")
    if kv_cache is not None and getattr(session, "steering", None) is not None:
        # Cache files do not record steering: a steered state could later be restored as a plain one.
        raise InvalidArgumentError("a disk KV cache cannot be used with directional steering")
    mode = think_mode_for_context(think, session.ctx)
    plan = None
    t0 = time.perf_counter()
    if kv_cache is None:
        prompt_tokens = build_prompt(engine.tokenizer, prompt, messages, tokens, system=system, tools=tools,
                                     think=mode, ctx=session.ctx, raw=raw)
    else:
        plan = _prepare_cached(kv_cache, engine, session, prompt, messages, tokens, system=system, tools=tools,
                               think=mode, raw=raw)
        prompt_tokens = plan.tokens
    prepare_seconds = time.perf_counter() - t0
    if not prompt_tokens:
        raise InvalidArgumentError("the prompt is empty (no tokens)")
    if len(prompt_tokens) >= session.ctx:
        raise ContextOverflowError(
            f"prompt has {len(prompt_tokens)} tokens, but the context holds {session.ctx} "
            "(at least one free slot is needed)"
        )
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    it = _run(engine, session, prompt_tokens, max_tokens, temperature, top_k, top_p, min_p, stops,
              seed, logprobs, progress, bool(tools) if dsml is None else dsml, kv_cache, plan, prepare_seconds,
              int(speculative or 0), mtp_margin)
    if stream:
        return it
    final = None
    for ev in it:
        final = ev
    assert isinstance(final, FinishEvent)
    return final


def _run(engine, session, prompt_tokens, max_tokens, temperature, top_k, top_p, min_p, stops, seed,
         logprobs, progress, dsml, kv_cache=None, plan=None, prepare_seconds=0.0,
         speculative=0, mtp_margin=DEFAULT_MARGIN) -> Iterator[GenerationEvent]:
    # Per-token work here is O(1) in the length of the generation: ``raw`` grows in place (a plain
    # local that nothing else references), stop strings and tool blocks are matched on the new
    # text only, the position is counted locally and the logits array is never copied.
    tok = engine.tokenizer
    t0 = time.perf_counter() - prepare_seconds  # a disk load counts as prompt time
    if kv_cache is None:
        live = session.pos
        cached = live if live and session.common_prefix(prompt_tokens) == live else 0
        cache_source = "memory" if cached else ""
        _sync(session, prompt_tokens, progress)
    else:
        cached = plan.cached_tokens
        cache_source = plan.source if cached else ""
        kv_cache.sync(_ProgressSession(session, progress) if progress is not None else session, plan, engine)
    t1 = time.perf_counter()

    eos = tok.special.eos
    think_end = tok.special.think_end
    thinking = tok.special.think_start is not None and prompt_tokens[-1] == tok.special.think_start
    channel = "reasoning" if thinking else "content"
    tracker = DsmlTracker() if dsml else None
    blocks: ToolBlockWatch | None = None  # watches post-think text for a complete tool block
    if tracker is not None and not thinking:
        blocks = ToolBlockWatch(0)
    raw = ""  # decoded text as generated, </think> included
    picker = TokenPicker(temperature, top_k, top_p, min_p, Rng(seed if seed is not None else time_seed()), tracker,
                         logprobs, engine=engine)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decode = decoder.decode
    token_bytes = tok.token_to_bytes
    matcher = StopMatcher(stops)
    push = matcher.push
    texts = {"reasoning": [], "content": []}
    out_tokens: list[int] = []
    finish, matched = None, None
    raw_len_at_stop: int | None = None
    budget = max_tokens if max_tokens is not None else session.ctx
    ctx = session.ctx
    pos = session.pos
    continued = kv_cache.continued_target if kv_cache is not None else None
    # Speculative decoding: a cycle commits the chosen token plus accepted drafts; those drafts
    # are emitted by the next iterations without another eval (``queued``), and a resampled
    # rejection becomes the next token (``resampled``). Off where per-token logits or checkpoints
    # are needed (logprobs, tool-call rules, continued checkpoints).
    spec = None
    if speculative > 0 and logprobs is None and tracker is None and continued is None and not picker.adjusts:
        spec = Speculator(speculative, margin=mtp_margin)
        params = SamplingParams(temperature, top_k, top_p, min_p)
    queued: list[int] = []
    resampled: int | None = None

    while True:
        if len(out_tokens) >= budget:
            finish = "length"
            break
        # A continued checkpoint before each decode step, never inside or after a tool block
        # (partial DSML must not become a saved frontier).
        if continued is not None and continued(pos) and (tracker is None or tracker.mode == "search"):
            kv_cache.maybe_store_continued(session, engine)
        if queued:
            token = queued.pop(0)   # already evaluated by the last speculative cycle
        elif resampled is not None:
            token, resampled = resampled, None
        else:
            token = picker.pick(session.logits)
        committed = spec is not None and session.pos > pos   # evaluated ahead by a cycle
        if token == eos:
            finish = "eos"
            break
        lp, tops = (picker.logprob, picker.tops) if logprobs is not None else (None, None)
        out_tokens.append(token)
        if channel == "reasoning" and token == think_end:
            flushed = decode(b"", final=True)
            decoder.reset()
            raw += flushed + THINK_END
            if tracker is not None:
                blocks = ToolBlockWatch(len(raw))
            released = matcher.reset() + flushed
            texts["reasoning"].append(released)
            yield TokenEvent(token, released, "reasoning", lp, tops)
            channel = "content"
        else:
            delta = decode(token_bytes(token))
            channel_start = len(raw) - matcher.length  # ``raw`` index where the channel's text began
            released, matched = push(delta)
            if matched is not None:
                raw_len_at_stop = channel_start + matcher.released
            raw += delta
            texts[channel].append(released)
            yield TokenEvent(token, released, channel, lp, tops)
            if matched is not None:
                finish = "stop"
                break
        if tracker is not None:
            tracker.update(raw)
            if blocks is not None and blocks.closed(raw):
                finish = "tool_calls"
                break
        if len(out_tokens) >= budget:
            finish = "length"
            break
        if pos >= ctx:
            finish = "context"
            break
        if not committed:
            try:
                if spec is None:
                    session.eval(token)
                else:
                    spec.n = min(speculative, budget - len(out_tokens) - 1)
                    cyc = spec.cycle(session, token, params, picker.rng, stop=eos)
                    queued, resampled = list(cyc.committed[1:]), cyc.next_token
            except ContextOverflowError:
                finish = "context"
                break
        pos += 1

    if finish != "stop":
        final = decode(b"", final=True)  # an incomplete UTF-8 tail becomes U+FFFD
        channel_start = len(raw) - matcher.length
        tail, late = push(final)
        if late is None:
            tail += matcher.reset()  # a stop string that never completed is ordinary text
        else:
            raw_len_at_stop = channel_start + matcher.released
        raw += final
        if tail:
            texts[channel].append(tail)
            yield TokenEvent(None, tail, channel)
    yield FinishEvent(
        finish_reason=finish,
        reasoning="".join(texts["reasoning"]),
        content="".join(texts["content"]),
        tokens=tuple(out_tokens),
        usage=Usage(len(prompt_tokens), len(out_tokens), cached, spec.drafted if spec else 0,
                    spec.accepted if spec else 0),
        prompt_seconds=t1 - t0,
        decode_seconds=time.perf_counter() - t1,
        stop=matched,
        raw_text=raw[:raw_len_at_stop] if raw_len_at_stop is not None else raw,  # cut at a stop string
        thinking=thinking,
        cache_source=cache_source,
    )
