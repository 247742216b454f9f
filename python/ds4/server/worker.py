"""The inference worker: one thread owns the engine's live session and runs jobs FIFO.

Port of upstream's ``worker_main`` / ``generate_job`` (docs/runtime.md §9.1, §9.5, §9.7): one generation
at a time, no batching. The live session is kept between requests, so a conversation that extends
the previous one only evaluates its new tokens. Cache decision, in upstream's order:

1. **responses-visible**: a Responses request whose rendered prompt extends the transcript the last
   Responses turn left (hidden reasoning stays in the KV);
2. **responses-tool-output** / **anthropic-tool-output**: the trailing tool outputs answer exactly
   the live session's last calls: append EOS + the results to the live KV; a request that needs
   this state but finds it replaced gets 409;
3. **memory-token**: the live tokens are a prefix of the request's tokens;
4. **thinking-visible**: after a tool-less thinking turn, the next request replays the visible
   transcript without the hidden reasoning; the live state (with reasoning) is kept and only the
   text after the remembered visible transcript is tokenized;
5. **memory-text**: the decoded live text is a byte prefix of the rendered prompt;
6. otherwise, with a disk KV cache, the live state is stored (``evict``) and the longest cached
   text prefix is loaded (``disk-text``); else a cold prefill (stored ``cold`` when long enough).

The decode loop is the server's own (not :func:`ds4.generation.generate`) because its semantics
differ: every sampled token is evaluated, stop strings match the raw bytes including reasoning,
thinking mode overrides the sampling knobs, DSML syntax is sampled greedily, a closed tool block
ends the turn, and continued disk checkpoints are written between tokens.

Each job's response is shaped by its API's output (:mod:`.api_chat`, :mod:`.api_completions`,
:mod:`.api_anthropic`, :mod:`.responses`; interface in :mod:`.turn`) and written into the job's sink
(:mod:`.sinks`); a sink whose client went away stops the job at the next token or prefill chunk.
"""

from __future__ import annotations

import codecs
import collections
import dataclasses
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..chat_template import EOS as EOS_TEXT, THINK_END, THINK_START, forced_tool_opening
from ..dsml import DsmlTracker, ToolCall, parse_generated
from ..errors import Ds4Error
from ..decoding import StopMatcher, TokenPicker, ToolBlockWatch
from ..sampling import DEFAULT_MIN_P, DEFAULT_TEMPERATURE, DEFAULT_TOP_P, Rng, SamplingParams
from ..speculative import DEFAULT_MARGIN, Speculator
from . import shapes
from .metrics import JobStats, Metrics
from .protocol import Request
from .api_anthropic import AnthropicOutput
from .api_chat import ChatOutput
from .api_completions import CompletionOutput
from .responses import ResponsesOutput
from .sinks import Sink
from .tool_state import LiveBindings, ToolMemory
from .turn import Output, Turn
from .textscan import ThinkingTracker, utf8_safe_len

__all__ = ["Sink", "Job", "JobResult", "Worker", "ToolMemory"]

log = logging.getLogger("ds4.server")

KEEPALIVE_SECONDS = 5.0  # ": prefill" SSE comments while a long prompt is evaluated

# The output of each API (streams and bodies), by Request.api ("completion" for legacy completions)
_OUTPUTS = {"openai": ChatOutput, "completion": CompletionOutput, "anthropic": AnthropicOutput,
            "responses": ResponsesOutput}


@dataclass
class JobResult:
    """What a finished job produced (also handy for tests and logs)."""

    finish: str = "error"
    text: bytes = b""
    completion: int = 0
    prompt_tokens: int = 0
    cached: int = 0
    source: str = "none"
    calls: tuple[ToolCall, ...] = ()
    error: str = ""
    prefill_s: float = 0.0
    decode_s: float = 0.0


@dataclass
class Job:
    req: Request
    sink: Sink
    done: threading.Event = field(default_factory=threading.Event)
    result: JobResult | None = None


class _ProgressSession:
    """The live session with a progress callback on every ``sync`` (the disk cache syncs in
    steps and knows nothing about keep-alives)."""

    def __init__(self, session, progress) -> None:
        self._s, self._progress = session, progress

    def sync(self, tokens, progress=None) -> None:
        self._s.sync(tokens, progress=progress or self._progress)

    def __getattr__(self, name: str):
        return getattr(self._s, name)


class _ClientGone(Exception):
    """The client of the running job went away (its sink failed): stop the prefill."""


class _LiveStateLost(Exception):
    """The request needs live tool state that another request replaced (HTTP 409)."""


class Worker:
    """Owns ``engine``'s single live session (``ctx`` tokens) and executes jobs in order."""

    def __init__(self, engine, ctx: int, default_tokens: int, kv_cache=None, tool_memory: ToolMemory | None = None,
                 trace=None, metrics: Metrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics if metrics is not None else Metrics()
        self.tok = engine.tokenizer
        self.session = engine.session(ctx=ctx)
        self.ctx = ctx
        self.default_tokens = default_tokens
        self.kv = kv_cache
        self.tools = tool_memory if tool_memory is not None else ToolMemory()
        self.seq = 0
        self.stopping = False
        self.jobs_started = 0
        self.jobs_done = 0
        self.running = 0
        self.last_result: JobResult | None = None
        self._queue: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._thinking_live: tuple[bytes, int] | None = None  # (visible transcript, live position)
        self._responses_live: tuple[bytes, int] | None = None  # same, after a Responses turn
        self.live = LiveBindings()
        self.trace = trace  # a text stream for a human-readable per-request trace (--trace)
        self.mtp_draft = 0  # speculative decoding: MTP drafts per step (ServerConfig.mtp_draft)
        self.mtp_margin = DEFAULT_MARGIN  # and its confidence gate (ServerConfig.mtp_margin)
        self.drafted = self.accepted = 0  # of the last request

    # ---- queue ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ds4-worker", daemon=True)
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def submit(self, job: Job) -> bool:
        """Queue a job; False when the server is stopping (the caller answers 503)."""
        with self._cv:
            if self.stopping:
                return False
            self._queue.append(job)
            self._cv.notify()
            return True

    def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, let queued jobs finish (running loops end with finish "error")."""
        with self._cv:
            self.stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self.stopping:
                    self._cv.wait()
                if not self._queue:
                    return
                job = self._queue.popleft()
                self.jobs_started += 1
                self.running = 1
            try:
                if job.sink.failed:  # its client went away while it waited: no abandoned work
                    self.metrics.cancel()
                    job.result = self.last_result = JobResult(error="client disconnected before the job started")
                    continue
                job.result = self.run_job(job)
                r = job.result
                self.metrics.job(JobStats(r.prompt_tokens, r.cached, r.completion, r.prefill_s, r.decode_s,
                                          r.source))
                if r.error.startswith("client disconnected"):
                    self.metrics.cancel()
            except Exception as e:  # never let one request kill the worker
                log.exception("ds4-server: job failed")
                self.session.reset()
                if not job.sink.headers_sent:
                    job.sink.error(500, f"internal error: {e}")
                else:
                    job.sink.send(shapes.sse_error(job.req.api, str(e)))
                job.result = JobResult(error=str(e))
            finally:
                self.running = 0
                self.jobs_done += 1
                job.done.set()
                job.sink.close()

    def shutdown_store(self) -> None:
        """Save the live state as a "shutdown" checkpoint (disk cache only)."""
        if self.kv is not None:
            try:
                self.kv.shutdown(self.session, self.engine, **self._store_kw(visible=True))
            except Ds4Error as e:
                log.warning("ds4-server: shutdown kv store failed: %s", e)

    def _trace(self, text: str) -> None:
        if self.trace is None:
            return
        try:
            self.trace.write(text)
            self.trace.flush()
        except (OSError, ValueError) as e:
            log.warning("ds4-server: trace write failed, tracing off: %s", e)
            self.trace = None

    def _store_kw(self, visible: bool = False) -> dict:
        """Extra arguments for a disk-cache store: the tool map, and for evict/shutdown stores at
        the remembered thinking frontier the client-visible transcript as the key."""
        from ..kvcache_format import EXT_RESPONSES_VISIBLE, EXT_THINKING_VISIBLE

        kw: dict = {}
        if self.tools.max_ids > 0 and len(self.tools):
            kw["tool_map"] = self.tools.snapshot()
        if visible:
            for live, flag in ((self._responses_live, EXT_RESPONSES_VISIBLE), (self._thinking_live, EXT_THINKING_VISIBLE)):
                if live is not None and live[1] == self.session.pos:
                    kw.update(text=live[0], ext_flags=flag)
                    break
        return kw

    # ---- cache decision (§9.7) --------------------------------------------------------------------
    def _token_bytes(self, tokens: list[int]) -> bytes:
        return b"".join(self.tok.token_to_bytes(t) for t in tokens)

    def _extend(self, live: list[int], rest: bytes) -> list[int] | None:
        try:
            text = rest.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return live + (list(self.tok.encode_rendered(text)) if text else [])

    def _prepare(self, req: Request) -> tuple[list[int], int, str, Any]:
        """(tokens to sync, reused prefix, source, kv plan or None)."""
        live = self.session.tokens
        old_pos = len(live)
        prompt_bytes = req.prompt_text.encode("utf-8")
        rl = self._responses_live
        if (old_pos and rl is not None and req.api == "responses" and rl[1] == old_pos
                and len(rl[0]) < len(prompt_bytes) and prompt_bytes.startswith(rl[0])):
            tokens = self._extend(live, prompt_bytes[len(rl[0]):])
            if tokens is not None:
                return tokens, old_pos, "responses-visible", None
        if (old_pos and req.live_tail is not None and req.api in ("responses", "anthropic")
                and self.live.matches(req.api, req.live_ids, old_pos)):
            tokens = self._extend(live, req.live_tail.encode("utf-8"))
            if tokens is not None:
                return tokens, old_pos, f"{req.api}-tool-output", None
        if req.requires_live:
            raise _LiveStateLost(
                "Responses continuation state is not available; retry by replaying the full input history"
                if req.api == "responses" else
                "Anthropic continuation state is not available; retry by replaying the full messages history")
        if old_pos and len(req.prompt) >= old_pos and self.session.common_prefix(req.prompt) == old_pos:
            return req.prompt, old_pos, "memory-token", None
        tl = self._thinking_live
        if (old_pos and tl is not None and req.kind == "chat" and req.api != "responses" and tl[1] == old_pos
                and len(tl[0]) < len(prompt_bytes) and prompt_bytes.startswith(tl[0])):
            tokens = self._extend(live, prompt_bytes[len(tl[0]):])
            if tokens is not None:
                return tokens, old_pos, "thinking-visible", None
        if old_pos:
            live_text = self._token_bytes(live)
            if prompt_bytes.startswith(live_text):
                tokens = self._extend(live, prompt_bytes[len(live_text):])
                if tokens is not None:
                    return tokens, old_pos, "memory-text", None
            log.info("ds4-server: live kv cache miss live=%d prompt=%d", old_pos, len(req.prompt))
        if self.kv is not None:
            # Save the live state before a disk hit or a cold prefill replaces it (evict), with the
            # tool map and, at a thinking frontier, the visible transcript as key (§7.2, §7.4).
            if old_pos >= self.kv.min_tokens:
                self.kv.store(self.session, "evict", self.engine, **self._store_kw(visible=True))
            self.session.reset()
            plan = self.kv.prepare(self.session, req.prompt_text, self.engine, reuse_live=False)
            if plan.tool_map and self.tools.max_ids > 0:
                self.tools.remember_pairs(plan.tool_map)
            if plan.source == "disk":
                return plan.tokens, plan.cached_tokens, "disk-text", plan
            # the cache tokenized the same text: keep the request's own tokens (identical)
            return req.prompt, 0, "none", dataclasses.replace(plan, tokens=req.prompt)
        return req.prompt, 0, "none", None

    def _sync(self, job: Job, tokens: list[int], cached: int, plan) -> None:
        t_last = [time.monotonic()]
        req, sink = job.req, job.sink

        def progress(done: int, total: int) -> None:
            if sink.failed:
                raise _ClientGone()
            if not req.stream:
                return
            now = time.monotonic()
            if not sink.headers_sent:
                sink.sse_headers()
            elif now - t_last[0] >= KEEPALIVE_SECONDS:
                sink.send(b": prefill\n\n")
                t_last[0] = now

        if self.kv is not None:
            from ..kvcache import PreparedPrompt
            if plan is None:
                plan = PreparedPrompt(tokens, cached, "memory")
            self.kv.sync(_ProgressSession(self.session, progress), plan, self.engine, **self._store_kw())
        else:
            self.session.sync(tokens, progress=progress)

    # ---- one job ----------------------------------------------------------------------------------
    def run_job(self, job: Job) -> JobResult:
        req, sink = job.req, job.sink
        res = JobResult()
        try:
            tokens, cached, source, plan = self._prepare(req)
        except _LiveStateLost as e:
            res.error = str(e)
            sink.error(409, str(e))
            return res
        res.prompt_tokens, res.cached, res.source = len(tokens), cached, source
        self.last_result = res  # filled in as the job runs (readable once the response is out)
        usage = shapes.Usage(len(tokens), cached, 0)
        t0 = time.monotonic()
        try:
            if len(tokens) >= self.ctx:
                from ..errors import ContextOverflowError
                raise ContextOverflowError(f"prompt has {len(tokens)} tokens, context is {self.ctx}")
            self._sync(job, tokens, cached, plan)
        except _ClientGone:
            # the evaluated prefix is still a valid live state (the session's position is the
            # tokens done), so the next request can reuse it
            res.error = "client disconnected during prefill"
            res.prefill_s = time.monotonic() - t0
            log.info("ds4-server: %s", res.error)
            return res
        except Ds4Error as e:
            self.session.reset()
            self._thinking_live = None
            res.error = f"prefill failed: {e}"
            log.warning("ds4-server: %s", res.error)
            if sink.headers_sent:
                sink.send(shapes.sse_error(req.api, res.error))
            else:
                sink.error(500, res.error)
            return res
        res.prefill_s = time.monotonic() - t0
        if source != "thinking-visible":
            self._thinking_live = None
        if source not in ("responses-visible", "responses-tool-output"):
            self._responses_live = None
            self.live.clear("responses")
        if source != "anthropic-tool-output":
            self.live.clear("anthropic")
        log.info("ds4-server: %s prompt=%d cached=%d source=%s prefill %.3fs", req.kind, len(tokens), cached,
                 source, time.monotonic() - t0)
        self._trace(f"=== request {self.seq + 1} api={req.api} kind={req.kind} think={req.think} "
                    f"tools={int(req.has_tools)} stream={int(req.stream)} prompt={len(tokens)} cached={cached} "
                    f"source={source} max_tokens={req.max_tokens}\n--- prompt text\n{req.prompt_text}\n")

        self.seq += 1
        resp_id = {"anthropic": "msg_"}.get(req.api, "chatcmpl-" if req.kind == "chat" else "cmpl-") + secrets.token_hex(12)
        self.last_logprobs = [] if req.logprobs else None  # filled by the decode loop, read by the output
        output = _OUTPUTS["completion" if req.kind == "completion" else req.api](
            sink, resp_id, req, lambda: self._new_ids(1, req.api)[0], self.tok, self.last_logprobs)
        if req.stream and (sink.failed or not sink.sse_headers() or not output.start(usage)):
            res.error = "client disconnected"
            return res

        t1 = time.monotonic()
        text, finish, completion, err = self._decode(req, sink, output)
        res.text, res.completion, res.decode_s = text, completion, time.monotonic() - t1
        usage = shapes.Usage(len(tokens), cached, completion)

        content = reasoning = None
        recovered = False
        raw_dsml = None
        calls: tuple[ToolCall, ...] = ()
        ids: list[str] = []
        final_text = text.decode("utf-8", errors="replace")
        if req.kind == "chat":
            parsed = parse_generated(final_text, req.thinking)
            content, reasoning = parsed.content, parsed.reasoning
            if req.thinking and req.prompt_text.endswith(THINK_START) and THINK_END not in final_text:
                # the reasoning never closed (max_tokens or the context cut it): it is reasoning,
                # as the stream already said, not content
                content = ""
                reasoning = final_text[len(THINK_START):] if final_text.startswith(THINK_START) else final_text
            raw_dsml = parsed.raw_dsml
            if not parsed.ok and req.has_tools and finish != "error":
                recovered = True
                finish = "length" if finish == "length" else "stop"
                log.warning("ds4-server: invalid tool call returned as assistant text finish=%s", finish)
            if parsed.tool_calls:
                calls = parsed.tool_calls
                ids = list(output.tool_ids[:len(calls)])  # ids already sent while the calls streamed
                ids += self._new_ids(len(calls) - len(ids), req.api)
                if parsed.raw_dsml:
                    self.tools.remember(ids, parsed.raw_dsml)
                finish = "tool_calls"
                self._thinking_live = None
            elif (req.api != "responses" and not req.has_tools and not req.preserves_reasoning and req.thinking
                  and finish not in ("error", "length") and not self._inside_think(req, text)
                  and req.prompt_text.endswith("<think>")):
                visible = req.prompt_text[:-len("<think>")] + "</think>" + (content or "") + EOS_TEXT
                self._thinking_live = (visible.encode("utf-8"), self.session.pos)
            else:
                self._thinking_live = None
        res.finish, res.calls, res.error = finish, calls, err
        if req.api == "responses":
            self._remember_responses(req, finish, content or "", reasoning, calls, raw_dsml)
            if finish not in ("error", "length") and self.session.pos:
                self.live.remember("responses", ids, self.session.pos)
            else:
                self.live.clear("responses")
        elif req.api == "anthropic":
            if calls and finish not in ("error", "length"):
                self.live.remember("anthropic", ids, self.session.pos)
            else:
                self.live.clear("anthropic")

        stop_seq = self.last_stop.decode("utf-8", "replace") if self.last_stop is not None else None
        output.finish(Turn(text, finish, usage, content or "", reasoning, calls, ids, recovered, stop_seq,
                           self.last_logprobs))
        if calls and self.tools.max_ids <= 0 and req.kind == "chat" and req.api != "responses":
            self._canonicalize(req, content or "", reasoning, calls)
        self._trace(f"--- generated ({completion} tokens, finish={finish}{', error=' + err if err else ''})\n"
                    f"{final_text}\n" + "".join(f"--- call {i} {c.name} {c.arguments}\n" for i, c in zip(ids, calls)))
        log.info("ds4-server: %s gen=%d finish=%s%s%s %.3fs", req.kind, completion, finish,
                 f' error="{err}"' if err else "",
                 f" mtp drafted={self.drafted} accepted={self.accepted}" if self.drafted else "", time.monotonic() - t0)
        return res

    def _remember_responses(self, req: Request, finish: str, content: str, reasoning: str | None, calls,
                            raw_dsml: str | None) -> None:
        """After a Responses turn, remember the transcript a client replaying it will render, at
        the live position (§9.7 responses-visible): the hidden reasoning stays in the KV."""
        from ..chat_template import render_tool_calls

        if finish in ("error", "length") or not self.session.pos:
            self._responses_live = None
            return
        suffix = ""
        if req.thinking:
            suffix = (reasoning or "" if req.reasoning_summary and calls else "") + "</think>"
        replay = raw_dsml if self.tools.max_ids > 0 else None
        suffix += content + render_tool_calls([(c.name, c.arguments) for c in calls], replay) + EOS_TEXT
        self._responses_live = ((req.prompt_text + suffix).encode("utf-8"), self.session.pos)

    def _canonicalize(self, req: Request, content: str, reasoning: str | None, calls) -> None:
        """Without exact DSML replay the next request renders these calls canonically (§8.7):
        make the live state hold that canonical transcript so the next turn reuses it."""
        from ..chat_template import render_tool_calls

        suffix = ((reasoning or "") + "</think>" if req.thinking else "") + content
        suffix += render_tool_calls([(c.name, c.arguments) for c in calls]) + EOS_TEXT
        rendered = req.prompt_text + suffix
        canonical = list(self.tok.encode_rendered(rendered))
        live = self.session.tokens
        if live == canonical or self._token_bytes(live) == rendered.encode("utf-8"):
            return
        common = self.session.common_prefix(canonical)
        if common < len(req.prompt):
            log.info("ds4-server: tool checkpoint canonicalization skipped: common=%d prompt=%d", common,
                     len(req.prompt))
            return
        try:
            if common == len(live) or self.kv is None:
                self.session.sync(canonical)  # extends in place, or rebuilds from scratch
            else:
                self.session.reset()
                plan = self.kv.prepare(self.session, rendered, self.engine, reuse_live=False)
                self.kv.sync(self.session, plan, self.engine, **self._store_kw())
            log.info("ds4-server: tool checkpoint canonicalized common=%d live=%d canonical=%d", common,
                     len(live), len(canonical))
        except Ds4Error as e:
            log.warning("ds4-server: tool checkpoint canonicalization failed: %s", e)
            self.session.reset()

    @staticmethod
    def _inside_think(req: Request, text: bytes) -> bool:
        t = ThinkingTracker(req.prompt_text)
        t.feed(text)
        return t.inside

    def _new_ids(self, n: int, api: str) -> list[str]:
        prefix = "toolu_" if api == "anthropic" else "call_"
        out: list[str] = []
        while len(out) < n:
            i = prefix + secrets.token_hex(16)
            if i not in out and not self.tools.has(i):
                out.append(i)
        return out

    def _seed(self, req: Request) -> int:
        if req.seed:
            return req.seed
        return ((int(time.time()) << 32) ^ (self.seq << 1) ^ (id(req) & 0xFFFFFFFF) ^ os.getpid()) & ((1 << 64) - 1)

    def _decode(self, req: Request, sink: Sink, output: Output) -> tuple[bytes, str, int, str]:
        """The sampling loop (§9.5 step 4-7): returns (raw text, finish, completion tokens, error).

        Token choice, stop strings and tool-block detection are the shared decode step
        (:mod:`ds4.decoding`); what is the server's own: every sampled token is evaluated, stops
        match the raw bytes (reasoning included), thinking mode overrides the sampling knobs, a
        forced tool choice writes the call opening once the reasoning is closed, DSML inside
        reasoning is never a call, and continued disk checkpoints are written between tokens."""
        s = self.session
        eos = self.tok.special.eos
        text = bytearray()
        finish, err = "length", ""
        completion = 0
        max_tokens = max(0, min(req.max_tokens, self.ctx - s.pos))
        temperature, top_k, top_p, min_p = req.temperature, req.top_k, req.top_p, req.min_p
        if req.thinking:  # the official API ignores sampling knobs in thinking mode
            temperature, top_k, top_p, min_p = DEFAULT_TEMPERATURE, 0, DEFAULT_TOP_P, DEFAULT_MIN_P
        tools_live = req.kind == "chat" and req.has_tools
        dsml = DsmlTracker() if tools_live else None  # where output is inside a DSML block (greedy rule)
        picker = TokenPicker(temperature, top_k, top_p, min_p, Rng(self._seed(req)), dsml,
                             req.top_logprobs if req.logprobs else None, req.logit_bias, req.presence_penalty,
                             req.frequency_penalty, engine=self.engine)
        stops = StopMatcher(req.stops)
        thinking = ThinkingTracker(req.prompt_text)
        # tool blocks count only after the reasoning is closed (DSML inside reasoning is never a call)
        watch = ToolBlockWatch(0) if tools_live and not (req.thinking and thinking.inside) else None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text_str = ""  # append-only decoded view for the DSML tracker and the block watch
        # forced tool choice: once the reasoning is closed, the DSML call opening is written for
        # the model (evaluated, not sampled), so the turn can only continue as that tool call
        force_pending = tools_live and req.forced_tool is not None
        self.last_stop: bytes | None = None
        # Speculative decoding (not with tools, logprobs, logit bias or penalties: they act per
        # token): a cycle commits the picked token plus accepted drafts, emitted by the next
        # iterations without another eval (``queued``); a resampled rejection becomes the next token.
        spec = None
        if self.mtp_draft > 0 and self.engine.has_mtp and not tools_live and self.last_logprobs is None \
                and not picker.adjusts:
            spec = Speculator(self.mtp_draft, margin=self.mtp_margin)
        queued: list[int] = []
        resampled = None

        while not self.stopping and completion < max_tokens and (queued or s.pos < self.ctx):
            if sink.failed:  # the client went away (streamed or not): stop generating for it
                finish, err = "error", "client disconnected"
                break
            if force_pending and not (req.thinking and thinking.inside):
                force_pending = False
                picker.force(self.tok.encode_rendered(forced_tool_opening(req.forced_tool)))
            if (self.kv is not None and not queued
                    and not (tools_live and ((watch is not None and watch.opened) or dsml.in_tool))
                    and self.kv.continued_target(s.pos)):
                self.kv.maybe_store_continued(s, self.engine, **self._store_kw())
            from_queue = bool(queued)
            if from_queue:
                token = queued.pop(0)   # evaluated by the last cycle
            elif resampled is not None:
                token, resampled = resampled, None
            else:
                token = picker.pick(s.logits)
            if token == eos:
                finish = "stop"
                break
            if self.last_logprobs is not None:
                self.last_logprobs.append((token, picker.logprob, [(t.id, t.logprob) for t in picker.tops]))
            if not from_queue:
                try:
                    if spec is None:
                        s.eval(token)
                    else:
                        spec.n = min(self.mtp_draft, max_tokens - completion - 1)
                        cyc = spec.cycle(s, token, SamplingParams(temperature, top_k, top_p, min_p), picker.rng,
                                         stop=eos)
                        queued, resampled = list(cyc.committed[1:]), cyc.next_token
                except Ds4Error as e:
                    finish, err = "error", f"decode failed: {e}"
                    break
            completion += 1
            piece = self.tok.token_to_bytes(token)
            text += piece
            thinking.feed(piece)
            if tools_live:
                text_str += decoder.decode(piece)
                dsml.update(text_str)
                if req.thinking and thinking.inside:
                    watch = None
                elif watch is None:
                    k = text_str.rfind("</think>")
                    watch = ToolBlockWatch(k + len("</think>") if k >= 0 else len(text_str))

            _, matched = stops.push(piece)
            released = stops.released  # bytes that cannot be the start of a stop string
            stream_len = utf8_safe_len(text, 0, released, matched is not None)
            if req.stream and not output.update(bytes(text[:stream_len])):
                finish, err = "error", "client disconnected"
                break

            if matched is not None:
                finish = "stop"
                self.last_stop = matched
                del text[released:]
                s.reset()  # the KV holds tokens past the visible end
                break
            if watch is not None and watch.closed(text_str):
                finish = "tool_calls"
                break

        self.drafted, self.accepted = (spec.drafted, spec.accepted) if spec is not None else (0, 0)
        if self.stopping and finish != "error":
            finish, err = "error", "shutdown requested"
        if watch is not None and watch.opened and finish not in ("error", "tool_calls"):
            finish, err = "error", "unterminated tool call"
        return bytes(text), finish, completion, err
