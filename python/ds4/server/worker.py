"""The inference worker: one thread owns the engine's live session and runs jobs FIFO.

Port of upstream's ``worker_main`` / ``generate_job`` (RUNTIME.md §9.1, §9.5, §9.7): one generation
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

Each job writes its own response through its :class:`Sink` (the client thread waits).
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
from typing import Any, Callable

from ..chat import EOS as EOS_TEXT, DsmlTracker, ToolCall, parse_generated
from ..errors import Ds4Error
from ..sampling import DEFAULT_MIN_P, DEFAULT_TEMPERATURE, DEFAULT_TOP_P, Rng, SamplingParams, sample
from ..speculative import Speculator
from . import shapes
from .protocol import Request
from .responses import ResponsesStream, responses_final
from .streams import AnthropicStream, OpenAIChatStream
from .textscan import (
    ThinkingTracker,
    find_stop,
    observe_tool_markers,
    stop_safe_len,
    utf8_safe_len,
)

__all__ = ["Sink", "Job", "JobResult", "Worker", "ToolMemory"]

log = logging.getLogger("ds4.server")

KEEPALIVE_SECONDS = 5.0  # ": prefill" SSE comments while a long prompt is evaluated


class Sink:
    """Where a job's response goes: a byte writer plus the HTTP framing upstream uses.

    ``write`` is any callable that sends all bytes or raises OSError. After the first failed write
    the sink is dead and every later send returns False (the worker then stops the job)."""

    def __init__(self, write: Callable[[bytes], Any], cors: bool = False) -> None:
        self._write = write
        self.cors = cors
        self.headers_sent = False
        self.failed = False

    def send(self, data: bytes) -> bool:
        if self.failed:
            return False
        try:
            self._write(data)
            return True
        except (OSError, ValueError):
            self.failed = True
            return False

    def _cors(self) -> str:
        return ("Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Methods: GET, POST, OPTIONS\r\n"
                "Access-Control-Allow-Headers: *\r\n") if self.cors else ""

    def response(self, status: int, body: bytes = b"", content_type: str | None = "application/json") -> bool:
        reason = {200: "OK", 204: "No Content", 400: "Bad Request", 404: "Not Found", 409: "Conflict",
                  500: "Internal Server Error"}.get(status, "Error")
        head = f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\n"
        if content_type:
            head += f"Content-Type: {content_type}\r\n"
        head += self._cors() + "Connection: close\r\n\r\n"
        self.headers_sent = True
        return self.send(head.encode() + body)

    def error(self, status: int, message: str) -> bool:
        return self.response(status, shapes.error_body(message))

    def sse_headers(self) -> bool:
        if self.headers_sent:
            return True
        self.headers_sent = True
        head = ("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                + self._cors() + "Connection: close\r\n\r\n")
        return self.send(head.encode())


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


@dataclass
class Job:
    req: Request
    sink: Sink
    done: threading.Event = field(default_factory=threading.Event)
    result: JobResult | None = None


class ToolMemory:
    """Tool-call id -> the exact sampled DSML block (§8.6), LRU-bounded by id count.

    ``fallback(ids) -> {id: dsml bytes}`` is asked for ids not in memory (the disk cache's KTM
    trailers), so exact replay survives a restart. ``max_ids=0`` disables replay entirely."""

    def __init__(self, max_ids: int = 100000, fallback: Callable[[list[str]], dict] | None = None,
                 max_bytes: int = 512 * 1024 * 1024) -> None:
        self.max_ids = max_ids
        self.max_bytes = max_bytes
        self.fallback = fallback
        self._map: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._blocks: dict[str, int] = {}  # distinct block -> how many ids use it (bytes count once)
        self._bytes = 0
        self._lock = threading.Lock()

    def _drop_oldest(self) -> None:
        _, block = self._map.popitem(last=False)
        self._unref(block)

    def _unref(self, block: str) -> None:
        n = self._blocks[block] - 1
        if n:
            self._blocks[block] = n
        else:
            del self._blocks[block]
            self._bytes -= len(block)

    def __len__(self) -> int:
        return len(self._map)

    def snapshot(self) -> dict[str, bytes]:
        """All id -> DSML pairs as bytes (for a cache file's KTM trailer)."""
        with self._lock:
            return {k: v.encode("utf-8") for k, v in self._map.items()}

    def remember_pairs(self, pairs: dict) -> None:
        by_block: dict[str, list[str]] = {}
        for k, v in pairs.items():
            by_block.setdefault(v.decode("utf-8", "replace") if isinstance(v, bytes) else v, []).append(k)
        for block, ids in by_block.items():
            self.remember(ids, block)

    def remember(self, ids: list[str], raw_dsml: str) -> None:
        if self.max_ids <= 0:
            return
        with self._lock:
            for i in ids:
                old = self._map.get(i)
                if old is not None:
                    self._unref(old)
                self._map[i] = raw_dsml
                self._map.move_to_end(i)
                if raw_dsml not in self._blocks:
                    self._blocks[raw_dsml] = 0
                    self._bytes += len(raw_dsml)
                self._blocks[raw_dsml] += 1
            while self._map and (len(self._map) > self.max_ids or self._bytes > self.max_bytes):
                self._drop_oldest()

    def has(self, i: str) -> bool:
        with self._lock:
            return i in self._map

    def lookup(self, ids: list[str]) -> str | None:
        """The block shared by all ``ids`` (all known, all the same block), else None."""
        if not ids or self.max_ids <= 0:
            return None
        if self.fallback is not None:
            with self._lock:
                missing = [i for i in ids if i not in self._map]
            if missing:
                try:
                    self.remember_pairs(self.fallback(missing))
                except Exception as e:  # a disk problem only costs exact replay
                    log.warning("ds4-server: tool memory restore failed: %s", e)
        with self._lock:
            blocks = {self._map.get(i) for i in ids}
            for i in ids:
                if i in self._map:
                    self._map.move_to_end(i)
        if len(blocks) != 1 or None in blocks:
            return None
        return blocks.pop()


class _ProgressSession:
    """The live session with a progress callback on every ``sync`` (the disk cache syncs in
    steps and knows nothing about keep-alives)."""

    def __init__(self, session, progress) -> None:
        self._s, self._progress = session, progress

    def sync(self, tokens, progress=None) -> None:
        self._s.sync(tokens, progress=progress or self._progress)

    def __getattr__(self, name: str):
        return getattr(self._s, name)


class _LiveStateLost(Exception):
    """The request needs live tool state that another request replaced (HTTP 409)."""


class LiveBindings:
    """Tool-call ids of the live session's last turn, per protocol, at the live position (§9.7):
    a later request answering exactly those calls continues the live KV. Read by client threads
    while parsing, written by the worker, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, tuple[frozenset[str], int]] = {}

    def remember(self, api: str, ids, pos: int) -> None:
        with self._lock:
            self._ids[api] = (frozenset(ids), pos)

    def clear(self, api: str) -> None:
        with self._lock:
            self._ids.pop(api, None)

    def has(self, api: str, call_id: str) -> bool:
        with self._lock:
            b = self._ids.get(api)
            return b is not None and call_id in b[0]

    def matches(self, api: str, ids, pos: int) -> bool:
        with self._lock:
            b = self._ids.get(api)
            return b is not None and b[1] == pos and b[0] == frozenset(ids)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Worker:
    """Owns ``engine``'s single live session (``ctx`` tokens) and executes jobs in order."""

    def __init__(self, engine, ctx: int, default_tokens: int, kv_cache=None, tool_memory: ToolMemory | None = None,
                 trace=None) -> None:
        self.engine = engine
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
        self.last_result: JobResult | None = None
        self._queue: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._thinking_live: tuple[bytes, int] | None = None  # (visible transcript, live position)
        self._responses_live: tuple[bytes, int] | None = None  # same, after a Responses turn
        self.live = LiveBindings()
        self.trace = trace  # a text stream for a human-readable per-request trace (--trace)
        self.mtp_draft = 0  # speculative decoding: MTP drafts per step (ServerConfig.mtp_draft)
        self.drafted = self.accepted = 0  # of the last request

    # ---- queue ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ds4-worker", daemon=True)
        self._thread.start()

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
            try:
                job.result = self.run_job(job)
            except Exception as e:  # never let one request kill the worker
                log.exception("ds4-server: job failed")
                self.session.reset()
                if not job.sink.headers_sent:
                    job.sink.error(500, f"internal error: {e}")
                else:
                    job.sink.send(shapes.sse_error(job.req.api, str(e)))
                job.result = JobResult(error=str(e))
            finally:
                self.jobs_done += 1
                job.done.set()

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
        if old_pos and _common_prefix(live, req.prompt) == old_pos and len(req.prompt) >= old_pos:
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
            if not req.stream or sink.failed:
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
        resp_id = f"{'chatcmpl' if req.kind == 'chat' else 'cmpl'}-{self.seq}"
        stream_chat = stream_anth = stream_resp = None
        if req.stream:
            if sink.failed or not sink.sse_headers():
                return res
            if req.api == "responses":
                stream_resp = ResponsesStream(sink.send, req)
                if not stream_resp.start():
                    return res
            elif req.api == "anthropic":
                stream_anth = AnthropicStream(sink.send, resp_id, req.model, req.thinking, req.has_tools,
                                              lambda: self._new_ids(1, req.api)[0])
                if not stream_anth.start(usage):
                    return res
            elif req.kind == "chat":
                stream_chat = OpenAIChatStream(sink.send, resp_id, req.model, req.thinking, req.has_tools,
                                               lambda: self._new_ids(1, req.api)[0])
                if not stream_chat.start():
                    return res

        text, finish, completion, err = self._decode(req, sink, resp_id, stream_chat or stream_resp, stream_anth)
        res.text, res.completion = text, completion
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
            raw_dsml = parsed.raw_dsml
            if not parsed.ok and req.has_tools and finish != "error":
                recovered = True
                finish = "length" if finish == "length" else "stop"
                log.warning("ds4-server: invalid tool call returned as assistant text finish=%s", finish)
            if parsed.tool_calls:
                calls = parsed.tool_calls
                live = (stream_chat or stream_anth).tool_ids if (stream_chat or stream_anth) else []
                if req.api == "responses":
                    live = []
                ids = list(live[:len(calls)])  # ids already sent while the calls streamed
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

        if req.stream:
            if stream_resp is not None:
                stream_resp.finish(text, recovered, calls, ids, finish, usage)
            elif stream_anth is not None:
                stream_anth.finish(text, calls, ids, finish, completion)
            elif stream_chat is not None:
                stream_chat.finish(text, calls, ids, finish, usage, req.include_usage)
            else:
                out = shapes.completion_chunk(resp_id, req.model, "", finish)
                if req.include_usage:
                    out += shapes.usage_chunk(resp_id, req.model, "completion", usage)
                sink.send(out + b"data: [DONE]\n\n")
        elif req.api == "responses":
            sink.response(200, responses_final(req, content or "", reasoning, calls, ids, finish, usage))
        elif req.api == "anthropic":
            sink.response(200, shapes.anthropic_final(resp_id, req.model, content or "", reasoning, calls, ids,
                                                      finish, usage))
        elif req.kind == "chat":
            sink.response(200, shapes.chat_final(resp_id, req.model, content or "", reasoning, calls, ids,
                                                 finish, usage))
        else:
            sink.response(200, shapes.completion_final(resp_id, req.model, final_text, finish, usage))
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
        from ..chat import render_tool_calls

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
        from ..chat import render_tool_calls

        suffix = ((reasoning or "") + "</think>" if req.thinking else "") + content
        suffix += render_tool_calls([(c.name, c.arguments) for c in calls]) + EOS_TEXT
        rendered = req.prompt_text + suffix
        canonical = list(self.tok.encode_rendered(rendered))
        live = self.session.tokens
        if live == canonical or self._token_bytes(live) == rendered.encode("utf-8"):
            return
        common = _common_prefix(live, canonical)
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

    def _decode(self, req: Request, sink: Sink, resp_id: str, stream_chat, stream_anth) -> tuple[bytes, str, int, str]:
        """The sampling loop (§9.5 step 4-7): returns (raw text, finish, completion tokens, error)."""
        s = self.session
        eos = self.tok.special.eos
        text = bytearray()
        finish, err = "length", ""
        completion = 0
        max_tokens = max(0, min(req.max_tokens, self.ctx - s.pos))
        rng = Rng(self._seed(req))
        stops = req.stops
        max_stop = max((len(x) for x in stops), default=0)
        stop_scan_from = 0
        plain_pos = 0
        tools_live = req.kind == "chat" and req.has_tools
        thinking = ThinkingTracker(req.prompt_text)
        wait_think_close = req.thinking and thinking.inside
        saw_start = saw_end = orphan_logged = False
        tool_scan_from = 0
        dsml = DsmlTracker()  # where generation is inside a DSML block (greedy rule, §3.7)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text_str = ""  # append-only decoded view for the tracker
        # Speculative decoding (not with tools: DSML is sampled greedily token by token): a cycle
        # commits the sampled token plus accepted drafts, emitted by the next iterations without
        # another eval (``queued``); a resampled rejection becomes the next token (``forced``).
        spec = Speculator(self.mtp_draft) if self.mtp_draft > 0 and self.engine.has_mtp and not tools_live else None
        queued: list[int] = []
        forced = None

        while not self.stopping and completion < max_tokens and (queued or s.pos < self.ctx):
            in_tool = tools_live and dsml.in_tool
            if (self.kv is not None and not queued and not (tools_live and (saw_start or in_tool))
                    and self.kv.continued_target(s.pos)):
                self.kv.maybe_store_continued(s, self.engine, **self._store_kw())
            temperature, top_k, top_p, min_p = req.temperature, req.top_k, req.top_p, req.min_p
            if req.thinking:  # the official API ignores sampling knobs in thinking mode
                temperature, top_k, top_p, min_p = DEFAULT_TEMPERATURE, 0, DEFAULT_TOP_P, DEFAULT_MIN_P
            if in_tool and dsml.greedy:
                temperature = 0.0
            from_queue = bool(queued)
            if from_queue:
                token = queued.pop(0)   # evaluated by the last cycle
            elif forced is not None:
                token, forced = forced, None
            else:
                token = sample(s.logits, temperature, top_k, top_p, min_p, rng)
            if token == eos:
                finish = "stop"
                break
            if not from_queue:
                try:
                    if spec is None:
                        s.eval(token)
                    else:
                        spec.n = min(self.mtp_draft, max_tokens - completion - 1)
                        cyc = spec.cycle(s, token, SamplingParams(temperature, top_k, top_p, min_p), rng, stop=eos)
                        queued, forced = list(cyc.committed[1:]), cyc.next_token
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

            hit = find_stop(stops, text, stop_scan_from)
            stream_len = hit[0] if hit else stop_safe_len(stops, len(text))
            stream_len = utf8_safe_len(text, plain_pos if stream_chat is None and stream_anth is None else 0,
                                       min(stream_len, len(text)), hit is not None)
            if hit is None and max_stop > 1:
                stop_scan_from = max(len(text) - (max_stop - 1), 0)

            ok = True
            if req.stream:
                view = bytes(text[:stream_len])
                if stream_anth is not None:
                    ok = stream_anth.update(view)
                elif stream_chat is not None:
                    ok = stream_chat.update(view)
                elif stream_len > plain_pos:
                    ok = sink.send(shapes.completion_chunk(resp_id, req.model,
                                                           text[plain_pos:stream_len].decode("utf-8", "replace")))
                    plain_pos = stream_len
            if not ok:
                finish, err = "error", "client stream write failed"
                break

            if tools_live:
                if req.thinking and thinking.inside:
                    wait_think_close = True  # DSML inside reasoning is never executable
                    tool_scan_from = len(text)
                else:
                    if wait_think_close:
                        k = text.rfind(b"</think>")
                        tool_scan_from = k + 8 if k >= 0 else len(text)
                        wait_think_close = False
                    saw_start, saw_end, orphan = observe_tool_markers(bytes(text), min(tool_scan_from, len(text)),
                                                                      saw_start, saw_end)
                    if orphan and not orphan_logged:
                        orphan_logged = True
                        log.warning("ds4-server: ignored orphan tool-call end marker after %d tokens", completion)
                    tool_scan_from = max(tool_scan_from, len(text) - 80)

            if hit is not None:
                finish = "stop"
                del text[hit[0]:]
                s.reset()  # the KV holds tokens past the visible end
                break
            if tools_live and saw_end:
                finish = "tool_calls"
                break

        self.drafted, self.accepted = (spec.drafted, spec.accepted) if spec is not None else (0, 0)
        if self.stopping and finish != "error":
            finish, err = "error", "shutdown requested"
        if tools_live and saw_start and not saw_end and finish != "error":
            finish, err = "error", "unterminated tool call"
        if req.stream and stream_chat is None and stream_anth is None and len(text) > plain_pos:
            if not sink.send(shapes.completion_chunk(resp_id, req.model, text[plain_pos:].decode("utf-8", "replace"))):
                finish = "error"
        return bytes(text), finish, completion, err
