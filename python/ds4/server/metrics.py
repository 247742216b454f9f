"""Server counters and their Prometheus text exposition (``GET /metrics``).

The worker records one :class:`JobStats` per finished job and the front end counts requests per
endpoint and status; ``render()`` writes the text format (version 0.0.4) that Prometheus scrapes.
Counters only grow; the tokens/s figures are gauges of the most recent job, and the totals let a
scraper compute rates over any window.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

__all__ = ["Metrics", "JobStats"]


@dataclass(frozen=True)
class JobStats:
    """What one job cost: prompt tokens evaluated (``prefill``), reused (``cached``), generated,
    the seconds each phase took, and where the reused prefix came from (``source``)."""

    prompt: int
    cached: int
    completion: int
    prefill_s: float
    decode_s: float
    source: str


class Metrics:
    """Thread-safe counters: the event loop counts requests, the worker counts jobs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.prompt_tokens = 0
        self.prefill_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.prefill_seconds = 0.0
        self.decode_seconds = 0.0
        self.sources: Counter[str] = Counter()
        self.last_prefill_tps = 0.0
        self.last_decode_tps = 0.0
        self.cancelled = 0

    def request(self, path: str, status: int) -> None:
        with self._lock:
            self.requests[(path, status)] += 1

    def job(self, s: JobStats) -> None:
        with self._lock:
            evaluated = max(s.prompt - s.cached, 0)
            self.prompt_tokens += s.prompt
            self.prefill_tokens += evaluated
            self.cached_tokens += s.cached
            self.completion_tokens += s.completion
            self.prefill_seconds += s.prefill_s
            self.decode_seconds += s.decode_s
            self.sources[s.source] += 1
            if evaluated and s.prefill_s > 0:
                self.last_prefill_tps = evaluated / s.prefill_s
            if s.completion and s.decode_s > 0:
                self.last_decode_tps = s.completion / s.decode_s

    def cancel(self) -> None:
        with self._lock:
            self.cancelled += 1

    def render(self, queue_depth: int, running: int, live_tokens: int) -> str:
        with self._lock:
            out: list[str] = []

            def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
                out.append(f"# HELP ds4_{name} {help_}")
                out.append(f"# TYPE ds4_{name} {kind}")
                for labels, value in samples:
                    out.append(f"ds4_{name}{labels} {value:g}" if isinstance(value, float) else
                               f"ds4_{name}{labels} {value}")

            metric("requests_total", "counter", "HTTP requests by path and status.",
                   [(f'{{path="{p}",status="{st}"}}', n) for (p, st), n in sorted(self.requests.items())])
            metric("prompt_tokens_total", "counter", "Prompt tokens of finished jobs (reused ones included).",
                   [("", self.prompt_tokens)])
            metric("prefill_tokens_total", "counter", "Prompt tokens evaluated (not reused).",
                   [("", self.prefill_tokens)])
            metric("cached_tokens_total", "counter", "Prompt tokens reused from the live session or disk cache.",
                   [("", self.cached_tokens)])
            metric("completion_tokens_total", "counter", "Generated tokens.", [("", self.completion_tokens)])
            metric("prefill_seconds_total", "counter", "Seconds spent evaluating prompts.",
                   [("", float(self.prefill_seconds))])
            metric("decode_seconds_total", "counter", "Seconds spent generating.", [("", float(self.decode_seconds))])
            metric("prefill_tokens_per_second", "gauge", "Prefill speed of the most recent job.",
                   [("", float(self.last_prefill_tps))])
            metric("decode_tokens_per_second", "gauge", "Decode speed of the most recent job.",
                   [("", float(self.last_decode_tps))])
            hits = [(f'{{source="{k}"}}', n) for k, n in sorted(self.sources.items())]
            metric("jobs_total", "counter", "Finished jobs by cache source (memory-* and *-visible/"
                   "*-tool-output: live-session hits; disk-text: disk-cache hits; none: cold).", hits)
            metric("live_session_hits_total", "counter", "Jobs that continued the live session.",
                   [("", sum(n for k, n in self.sources.items() if k not in ("none", "disk-text")))])
            metric("disk_cache_hits_total", "counter", "Jobs that loaded a disk KV cache checkpoint.",
                   [("", self.sources.get("disk-text", 0))])
            metric("cancelled_total", "counter", "Jobs stopped because their client went away.",
                   [("", self.cancelled)])
            metric("queue_depth", "gauge", "Jobs waiting for the worker.", [("", queue_depth)])
            metric("running", "gauge", "Jobs being generated (0 or 1).", [("", running)])
            metric("live_session_tokens", "gauge", "Tokens held by the live session.", [("", live_tokens)])
        return "\n".join(out) + "\n"
