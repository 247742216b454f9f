"""The context-frontier throughput bench (``ds4 bench``; upstream's ds4-bench method).

One fixed token sequence is walked to a series of context frontiers. At each frontier ``F`` the
bench times the incremental prefill from the previous frontier to ``F`` (the live prefix is
reused), takes an in-memory snapshot (untimed), times exactly ``gen_tokens`` greedy decode steps
that never pick EOS (so every row decodes the same number of tokens), and restores the snapshot
(untimed) before moving on. Rows report instantaneous speeds at that context length, with
upstream's CSV columns; ``kvcache_bytes`` is the snapshot's size.

    >>> frontiers(2048, 8192, step_incr=2048)
    [2048, 4096, 6144, 8192]
    >>> frontiers(1000, 5000, step_mul=2)
    [1000, 2000, 4000, 5000]
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from ._atomic import write_atomic
from .errors import Ds4IOError, InvalidArgumentError

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine

__all__ = ["frontiers", "FrontierRow", "run_frontiers", "CSV_COLUMNS", "csv_header", "csv_line", "BenchRun",
           "load_run", "compare_runs"]

CSV_COLUMNS = ("ctx_tokens", "prefill_tokens", "prefill_tps", "gen_tokens", "gen_tps", "kvcache_bytes")
FORMAT = "ds4-bench-frontier-v1"


def frontiers(ctx_start: int, ctx_max: int, step_incr: int = 2048, step_mul: float = 1.0) -> list[int]:
    """``ctx_start``, then ``+step_incr`` (``step_mul`` 1) or ``ceil(cur * step_mul)`` (at least
    ``cur + 1``), capped at ``ctx_max``, ending with ``ctx_max``."""
    if ctx_start < 1 or ctx_start > ctx_max:
        raise InvalidArgumentError(f"--ctx-start {ctx_start} must be between 1 and --ctx-max {ctx_max}")
    if not math.isfinite(step_mul) or step_mul < 1.0:
        raise InvalidArgumentError(f"--step-mul {step_mul} must be >= 1")
    if step_mul == 1.0 and step_incr < 1:
        raise InvalidArgumentError(f"--step-incr {step_incr} must be positive when --step-mul is 1")
    out = [ctx_start]
    while out[-1] < ctx_max:
        cur = out[-1]
        nxt = cur + step_incr if step_mul == 1.0 else max(math.ceil(cur * step_mul), cur + 1)
        out.append(min(nxt, ctx_max))
    return out


@dataclass(frozen=True)
class FrontierRow:
    ctx_tokens: int
    prefill_tokens: int
    prefill_tps: float
    gen_tokens: int
    gen_tps: float
    kvcache_bytes: int
    prefill_s: float
    gen_s: float


def csv_header() -> str:
    return ",".join(CSV_COLUMNS) + "\n"


def csv_line(r: FrontierRow) -> str:
    """Upstream's row format: speeds with two decimals."""
    return (f"{r.ctx_tokens},{r.prefill_tokens},{r.prefill_tps:.2f},{r.gen_tokens},{r.gen_tps:.2f},"
            f"{r.kvcache_bytes}\n")


def _greedy_not_eos(session, eos: int) -> int:
    t = session.argmax()
    if t != eos:
        return t
    logits = np.array(session.logits, copy=True)
    logits[eos] = -np.inf
    return int(np.argmax(logits))


def run_frontiers(engine: "Engine", tokens: Sequence[int], points: Sequence[int], gen_tokens: int, *,
                  ctx_alloc: int | None = None, eos: int | None = None,
                  progress: Callable[[int, int], None] | None = None) -> Iterator[FrontierRow]:
    """Yield one row per frontier (see the module docstring). ``progress(done, total)`` counts
    prefilled plus decoded tokens."""
    if gen_tokens < 1:
        raise InvalidArgumentError(f"--gen-tokens must be at least 1, got {gen_tokens}")
    top = points[-1]
    if len(tokens) < top:
        raise InvalidArgumentError(f"the prompt has {len(tokens)} tokens; --ctx-max {top} needs at least that many")
    alloc = top + gen_tokens + 1 if ctx_alloc is None else int(ctx_alloc)
    if alloc <= top + gen_tokens:
        raise InvalidArgumentError(f"--ctx-alloc {alloc} must be greater than ctx-max + gen-tokens = {top + gen_tokens}")
    if eos is None:
        eos = engine.tokenizer.require("eos")
    total = top + gen_tokens * len(points)
    done = 0
    s = engine.session(ctx=alloc)
    prev = 0
    toks = [int(t) for t in tokens[:top]]
    for f in points:
        base = done
        t0 = time.perf_counter()
        s.sync(toks[:f], (lambda d, _t: progress(base + d, total)) if progress else None)
        prefill_s = time.perf_counter() - t0
        done += f - prev
        snap = s.snapshot()
        t0 = time.perf_counter()
        for _ in range(gen_tokens):
            s.eval(_greedy_not_eos(s, eos))
        gen_s = time.perf_counter() - t0
        s.restore(snap)
        done += gen_tokens
        if progress is not None:
            progress(done, total)
        yield FrontierRow(f, f - prev, (f - prev) / prefill_s if prefill_s > 0 else 0.0, gen_tokens,
                          gen_tokens / gen_s if gen_s > 0 else 0.0, snap.nbytes, prefill_s, gen_s)
        prev = f


# ---- runs on disk ---------------------------------------------------------------------------------

@dataclass
class BenchRun:
    """A bench run as saved with ``--json``: settings, machine and rows."""

    settings: dict
    rows: list[FrontierRow]
    label: str = ""

    def to_json(self) -> dict:
        return {"format": FORMAT, **self.settings, "rows": [asdict(r) for r in self.rows]}

    def save(self, path: str | os.PathLike[str]) -> None:
        try:
            write_atomic(Path(path), [(json.dumps(self.to_json(), indent=2) + "\n").encode()])
        except OSError as e:
            raise Ds4IOError(f"{path}: cannot write bench JSON: {e.strerror or e}") from None


def machine_settings(engine: "Engine") -> dict:
    """What a reader needs to tell two runs apart: model, quantisation, backend, kernels, machine."""
    from . import _core

    return {
        "model": str(engine.path),
        "model_bytes": engine.path.stat().st_size,
        "variant": engine.info.variant,
        "routed_bits": engine.routed_bits,
        "backend": str(getattr(engine, "backend", "cpu")),
        "threads": engine.threads,
        "simd": _core.simd_path(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "logical_cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def load_run(path: str | os.PathLike[str]) -> BenchRun:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise Ds4IOError(f"{p}: cannot read bench JSON: {e.strerror or e}") from None
    except ValueError as e:
        raise InvalidArgumentError(f"{p}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidArgumentError(f"{p}: not a `ds4 bench --json` file (format {FORMAT!r} expected)")
    try:
        rows = [FrontierRow(**r) for r in data.pop("rows")]
    except (KeyError, TypeError) as e:
        raise InvalidArgumentError(f"{p}: malformed rows ({e})") from None
    data.pop("format")
    return BenchRun(data, rows, label=p.stem)


def compare_runs(a: BenchRun, b: BenchRun) -> list[dict]:
    """Rows at the frontiers both runs measured: A's and B's speeds and B/A ratios."""
    by_ctx = {r.ctx_tokens: r for r in b.rows}
    out = []
    for ra in a.rows:
        rb = by_ctx.get(ra.ctx_tokens)
        if rb is None:
            continue
        out.append({"ctx_tokens": ra.ctx_tokens,
                    "prefill_tps_a": ra.prefill_tps, "prefill_tps_b": rb.prefill_tps,
                    "prefill_ratio": rb.prefill_tps / ra.prefill_tps if ra.prefill_tps else math.nan,
                    "gen_tps_a": ra.gen_tps, "gen_tps_b": rb.gen_tps,
                    "gen_ratio": rb.gen_tps / ra.gen_tps if ra.gen_tps else math.nan})
    return out
