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
  replaced the live state);
* ``concurrent/N/ttft`` and ``concurrent/N/tok-s`` for N = 1, 4, 8 clients: ``ds4 serve`` runs as a
  second process and N client threads each send streaming chat requests at once; time to first
  token (request sent -> first content or reasoning delta) and each client's decode rate (tokens
  after the first / time after the first), plus ``concurrent/N/aggregate`` (all tokens / wall time).
  One model worker serves the requests in turn, so TTFT grows with the queue while the aggregate
  stays near the single-client rate.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import threading
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


def _stream_once(host: str, port: int, body: dict) -> tuple[float, float, int]:
    """(seconds to the first text delta, seconds from it to the end, completion tokens) of one
    streaming chat request."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True,
                                                              "stream_options": {"include_usage": True}}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    first = None
    tokens = 0
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        obj = json.loads(line[6:])
        if first is None and obj.get("choices") and any(
                obj["choices"][0]["delta"].get(k) for k in ("content", "reasoning_content")):
            first = time.perf_counter()
        if obj.get("usage"):
            tokens = obj["usage"]["completion_tokens"]
    end = time.perf_counter()
    conn.close()
    first = first if first is not None else end
    return first - t0, end - first, tokens


def _serve_process(path: str, ctx: int, threads: int):
    """``ds4 serve`` in a second process; returns (process, host, port) once it listens."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        x for x in (str(HERE.parent / "python"), os.environ.get("PYTHONPATH")) if x))
    proc = subprocess.Popen([sys.executable, "-m", "ds4.cli", "serve", "-m", str(path), "--port", "0", "-c", str(ctx),
                             "-t", str(threads)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining the log
            return proc, m.group(1), int(m.group(2))
    raise RuntimeError("ds4 serve did not start")


def concurrent_figures(path: str, ctx: int, threads: int, n_tokens: int, rounds: int, add) -> None:
    proc, host, port = _serve_process(path, ctx, threads)
    try:
        for clients in (1, 4, 8):
            ttft: list[float] = []
            rates: list[float] = []
            total = [0]
            lock = threading.Lock()

            def client(i: int) -> None:
                for r in range(rounds):
                    body = {"messages": [{"role": "user", "content": f"Client {i} round {r}: tell me a story."}],
                            "max_tokens": n_tokens, "temperature": 0, "thinking": False}
                    first, rest, tokens = _stream_once(host, port, body)
                    with lock:
                        ttft.append(first * 1e3)
                        if tokens > 1 and rest > 0:
                            rates.append((tokens - 1) / rest)
                        total[0] += tokens

            _stream_once(host, port, {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 2,
                                      "thinking": False})
            workers = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            wall = time.perf_counter() - t0
            add(f"concurrent/{clients}/ttft", "ms", ttft, f"{clients} streaming clients, time to first token")
            add(f"concurrent/{clients}/tok-s", "tok/s", rates, f"{clients} clients, per-client decode rate")
            add(f"concurrent/{clients}/aggregate", "tok/s", [total[0] / wall], f"{clients} clients, all tokens / wall")
    finally:
        proc.terminate()
        proc.wait(30)


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
            _post(srv.url, {"messages": [{"role": "user", "content": "reset"}], "max_tokens": 1, "thinking": False})
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

        # the first turn generates one token; the follow-up replays it and adds a new turn. The
        # tiny model's noise is often invalid UTF-8, which a client cannot replay byte for byte, so
        # the document is varied until the reply replays (the follow-up then reuses the live state)
        def turn(messages):
            return json.loads(_post(srv.url, {"messages": messages, "max_tokens": 1, "temperature": 0,
                                              "thinking": False}))

        for k in range(40):
            long_msgs = [{"role": "user", "content": f"Here is long document {k} about lighthouses. " * 40}]
            reply = turn(long_msgs)["choices"][0]["message"]["content"]
            follow = long_msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Summarise it."}]
            if turn(follow)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0:
                break

        def cont(live: bool):
            turn(long_msgs)
            if not live:
                turn([{"role": "user", "content": "other"}])
            t0 = time.perf_counter()
            turn(follow)
            return (time.perf_counter() - t0) * 1e3

        add("continue/live", "ms", [cont(True) for _ in range(args.repeats)], "follow-up turn, live session reused")
        add("continue/cold", "ms", [cont(False) for _ in range(args.repeats)], "same turn after the live state was evicted")
    concurrent_figures(path, args.ctx, args.threads, n, max(1, args.repeats // 3), add)
    print(f"model {path}, threads {args.threads}, {args.repeats} repeats\n")
    report(results, machine_info(threads=args.threads, model=str(path), tokens=n), args,
           ["figure", "what", "median", "unit", "spread"], rows)


if __name__ == "__main__":
    main()
