"""HTTP server overhead on a model (default: the bundled tiny model, where the model itself costs
almost nothing, so the figures are the server's own cost).

    PYTHONPATH=python python bench/server.py
    PYTHONPATH=python python bench/server.py --quick --json /tmp/server.json
    PYTHONPATH=python python bench/server.py --model ds4flash.gguf --tokens 64

Figures (median over repeats, loopback HTTP, one request at a time):

* ``request/1-token``: a chat completion with ``max_tokens=1`` on a fresh prompt (parse, render,
  tokenize, prefill, one token, JSON) -- the per-request floor;
* ``decode/direct`` vs ``decode/server`` and ``decode/server-stream``: generated tokens per second
  for ``--tokens`` greedy tokens through ``ds4.generation`` directly and through the server;
* ``continue/live``: a short follow-up turn after a long first turn (live session reuse: only the
  new turn is evaluated) next to ``continue/cold`` (the same prompt after an unrelated request
  replaced the live state).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
from _common import Result, add_common_args, machine_info, measure, report  # noqa: E402

import ds4  # noqa: E402
import ds4.testing  # noqa: E402
from ds4.generation import generate  # noqa: E402
from ds4.server import Server, ServerConfig  # noqa: E402


def _post(url: str, body: dict) -> bytes:
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=600) as f:
        return f.read()


def _timed(fn, repeats: int) -> list[float]:
    out = []
    fn()  # warm-up
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--model", default=None, help="GGUF (default: the bundled tiny model)")
    p.add_argument("--tokens", type=int, default=128, help="generated tokens for the decode figures")
    p.add_argument("--ctx", type=int, default=4096)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 3)
        args.tokens = min(args.tokens, 32)
    path = args.model or ds4.testing.default_model_path()
    eng = ds4.Engine(path, threads=args.threads)
    n = args.tokens
    results: list[Result] = []
    rows: list[dict] = []

    def add(name: str, unit: str, values: list[float], what: str) -> None:
        r = measure(name, unit, values)
        results.append(r)
        rows.append({"figure": name, "what": what, "median": r.median, "unit": unit,
                     "spread": f"{r.min:.3g}-{r.max:.3g}", "_names": {"median": name}})

    msgs = [{"role": "user", "content": "Tell me a story about a lighthouse."}]
    with Server(eng, ServerConfig(port=0, ctx=args.ctx)) as srv:
        counter = iter(range(10**9))
        secs = _timed(lambda: _post(srv.url, {"messages": [{"role": "user", "content": f"q{next(counter)}"}],
                                              "max_tokens": 1, "temperature": 0, "thinking": False}), args.repeats)
        add("request/1-token", "ms", [s * 1e3 for s in secs], "fresh prompt, 1 token, non-streaming")

        def direct():
            fin = generate(eng, messages=msgs, think="none", temperature=0, max_tokens=n, ctx=args.ctx, stream=False)
            return fin.usage.completion_tokens / fin.decode_seconds

        tps = [direct() for _ in range(args.repeats)]
        add("decode/direct", "tok/s", tps, f"{n} greedy tokens, ds4.generation")

        def via_server(stream: bool):
            _post(srv.url, {"messages": [{"role": "user", "content": "reset"}], "max_tokens": 0, "thinking": False})
            t0 = time.perf_counter()
            data = _post(srv.url, {"messages": msgs, "max_tokens": n, "temperature": 0, "thinking": False,
                                   "stream": stream, "stream_options": {"include_usage": True}})
            dt = time.perf_counter() - t0
            if stream:
                usage = [json.loads(line[6:]) for line in data.decode().split("\n\n")
                         if line.startswith("data: {") and '"usage"' in line][-1]["usage"]
            else:
                usage = json.loads(data)["usage"]
            return usage["completion_tokens"] / dt

        add("decode/server", "tok/s", [via_server(False) for _ in range(args.repeats)],
            f"{n} greedy tokens incl. prefill + HTTP, non-streaming")
        add("decode/server-stream", "tok/s", [via_server(True) for _ in range(args.repeats)],
            f"{n} greedy tokens incl. prefill + HTTP, SSE")

        # the first turn generates nothing (the tiny model's noise is often invalid UTF-8, which a
        # client could not replay byte for byte); the follow-up extends it with a long new turn
        long_msgs = [{"role": "user", "content": "Here is a long document about lighthouses. " * 40}]
        follow = long_msgs + [{"role": "assistant", "content": ""}, {"role": "user", "content": "Summarise it."}]

        def cont(live: bool):
            _post(srv.url, {"messages": long_msgs, "max_tokens": 0, "temperature": 0, "thinking": False})
            if not live:
                _post(srv.url, {"messages": [{"role": "user", "content": "other"}], "max_tokens": 0, "thinking": False})
            t0 = time.perf_counter()
            _post(srv.url, {"messages": follow, "max_tokens": 1, "temperature": 0, "thinking": False})
            return (time.perf_counter() - t0) * 1e3

        add("continue/live", "ms", [cont(True) for _ in range(args.repeats)], "follow-up turn, live session reused")
        add("continue/cold", "ms", [cont(False) for _ in range(args.repeats)], "same turn after the live state was evicted")
    print(f"model {path}, threads {args.threads}, {args.repeats} repeats\n")
    report(results, machine_info(threads=args.threads, model=str(path), tokens=n), args,
           ["figure", "what", "median", "unit", "spread"], rows)


if __name__ == "__main__":
    main()
