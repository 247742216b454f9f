"""Shared helpers for the benches: timing with repeats, machine info, table + JSON output,
--baseline ratios, and the machine's memory copy bandwidth measured in the same run.

Every bench prints a table and (with --json) writes {"machine": ..., "results": [...]} where each
result has a unique "name", the measured figure's "median" plus "min"/"max"/"samples", and a
"unit". `--baseline OLD.json` adds a column new/old for results with the same name.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

__all__ = [
    "Result",
    "add_common_args",
    "copy_bandwidth",
    "decode_switch_ab",
    "read_bandwidth",
    "machine_info",
    "measure",
    "print_table",
    "report",
    "time_call",
]


@dataclass
class Result:
    """One measured figure: `median` over repeats, with the spread of the samples."""

    name: str
    unit: str
    median: float
    min: float
    max: float
    samples: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=7, help="timed runs per figure (median reported)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for the ds4 kernels")
    p.add_argument("--json", type=Path, help="write results as JSON to this file")
    p.add_argument("--baseline", type=Path, help="earlier JSON: print new/old ratios")
    p.add_argument("--quick", action="store_true", help="fewer repeats and smaller shapes (smoke run)")


def time_call(fn: Callable[[], object], repeats: int, warmup: int = 1, min_time: float = 0.0,
              clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds per call for `repeats` timed runs. A run loops fn until `min_time` has passed so
    very short calls are not dominated by timer resolution. `clock`: time.process_time measures
    the process's CPU time instead of wall time (steadier on a loaded machine)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        calls = 0
        t0 = clock()
        while True:
            fn()
            calls += 1
            dt = clock() - t0
            if dt >= min_time:
                break
        out.append(dt / calls)
    return out


def measure(name: str, unit: str, values: Sequence[float], **extra) -> Result:
    vals = [float(v) for v in values]
    return Result(name, unit, statistics.median(vals), min(vals), max(vals), vals, dict(extra))


def put(results: list[Result], row: dict, col: str, name: str, values: Sequence[float], unit: str = "us") -> None:
    """Measure `values` under `name`, keep it in `results` and show its median in `row[col]` (the
    table's cell, with the result's name for --baseline ratios)."""
    r = measure(name, unit, values)
    results.append(r)
    row[col] = r.median
    row.setdefault("_names", {})[col] = name


def copy_bandwidth(mbytes: int = 256, repeats: int = 5) -> Result:
    """Single-threaded memory copy rate (bytes copied / second, numpy copyto) on buffers much
    larger than the caches; the usual 'copy' figure (the memory moves 2x these bytes)."""
    n = mbytes << 20
    src = np.ones(n, np.uint8)
    dst = np.empty_like(src)
    secs = time_call(lambda: np.copyto(dst, src), repeats)
    return measure("copy_bandwidth", "GB/s", [n / s / 1e9 for s in secs], mbytes=mbytes)


def read_bandwidth(threads: int, mbytes: int = 256, repeats: int = 5) -> Result:
    """Read bandwidth with ``threads`` threads: bytes per second that ds4's thread pool reads from
    a buffer much larger than the caches (``ds4._core.stream_read``, split like a decode matvec).
    The ceiling for decode's weight streaming; a copy moves twice its bytes and is slower."""
    import ds4._core as core

    buf = np.ones(mbytes << 20, np.uint8)
    old = core.threads()
    core.set_threads(threads)
    try:
        secs = time_call(lambda: core.stream_read(buf), repeats)
    finally:
        core.set_threads(old)
    return measure(f"read_bandwidth/t{threads}", "GB/s", [buf.size / s / 1e9 for s in secs], mbytes=mbytes)


def _git_commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True,
                               text=True, check=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(**extra) -> dict:
    return {
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "git_commit": _git_commit(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    }


def print_table(rows: Sequence[dict], columns: Sequence[str]) -> None:
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def report(results: Sequence[Result], machine: dict, args: argparse.Namespace, columns: Sequence[str],
           rows: Sequence[dict]) -> None:
    """Print the table (with baseline ratios when asked) and write the JSON file."""
    if args.baseline:
        old = {r["name"]: r for r in json.loads(args.baseline.read_text())["results"]}
        by_name = {r.name: r for r in results}
        for row in rows:
            for key, name in row.get("_names", {}).items():
                if name in old and name in by_name and old[name]["median"]:
                    row[f"{key}/base"] = by_name[name].median / old[name]["median"]
        columns = list(columns) + sorted({k for row in rows for k in row if k.endswith("/base")})
    if rows:
        print_table(rows, columns)
    if args.json:
        payload = {"machine": machine, "results": [asdict(r) for r in results]}
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        tmp.replace(args.json)
        print(f"wrote {args.json}")


def decode_switch_ab(eng, configs: dict[str, dict], rounds: int, block: int) -> dict[str, list[list[tuple[float, float]]]]:
    """Decode-step A/B inside one process: one session of ``eng`` decodes random tokens after a
    16-token prompt, and each round runs ``block`` steps under every config's decode switches
    (``ds4._core._decode_switches``; forward order on even rounds, reversed on odd ones, so every
    config sees the same machine). Returns, per config, per round, each step's (wall, process CPU)
    seconds. The switches are restored afterwards."""
    import ds4._core as core

    names = list(configs)
    n_steps = rounds * len(names) * block + 4
    s = eng.session(ctx=n_steps + 32)
    rng = np.random.default_rng(0)
    s.sync(rng.integers(0, eng.shape.n_vocab, 16).tolist())
    toks = iter(rng.integers(0, eng.shape.n_vocab, n_steps).tolist())
    for _ in range(4):
        s.eval(int(next(toks)))
    res: dict[str, list[list[tuple[float, float]]]] = {c: [] for c in names}
    before = core._decode_switches()
    try:
        for r in range(rounds):
            for c in names if r % 2 == 0 else names[::-1]:
                core._decode_switches(**configs[c])
                steps = []
                for _ in range(block):
                    c0, t0 = time.process_time(), time.perf_counter()
                    s.eval(int(next(toks)))
                    steps.append((time.perf_counter() - t0, time.process_time() - c0))
                res[c].append(steps)
    finally:
        core._decode_switches(**before)
    return res
