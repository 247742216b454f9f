"""``ds4 serve`` as a process: it binds, answers, and exits 0 on SIGINT after a graceful stop
(saving a shutdown checkpoint when a disk KV cache is configured)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import ds4.testing
from _installed import installed_env

ROOT = Path(__file__).resolve().parents[1]
DEADLINE = 60  # seconds for the whole process lifetime; the tiny model starts in well under 5


def _start(args, tmp_path):
    env = installed_env()
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "ds4.cli", "serve", "--port", "0", *args], stdout=log,
                            stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    t0 = time.monotonic()
    while time.monotonic() - t0 < DEADLINE:
        log.seek(0)
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log.read())
        if m:
            return proc, log, m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    log.seek(0)
    raise AssertionError(f"server did not start:\n{log.read()}")


def test_serve_process_sigint(tmp_path):
    kv = tmp_path / "kv"
    trace = tmp_path / "trace.txt"
    proc, log, url = _start(["-m", str(ds4.testing.default_model_path()), "-c", "512", "-n", "4", "-t", "1",
                             "--kv-cache-dir", str(kv), "--kv-cache-min-tokens", "4",
                             "--kv-cache-cold-max-tokens", "0", "--trace", str(trace)], tmp_path)
    try:
        body = json.dumps({"messages": [{"role": "user", "content": "Hello there"}], "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", data=body)
        with urllib.request.urlopen(req, timeout=30) as f:
            obj = json.loads(f.read())
        assert obj["usage"]["completion_tokens"] <= 4  # -n is the default budget
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=DEADLINE) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    log.seek(0)
    text = log.read()
    assert "stopped" in text
    assert len(list(kv.glob("*.kv"))) == 1  # the shutdown checkpoint
    t = trace.read_text()
    assert "=== request 1 api=openai kind=chat" in t and "<｜User｜>Hello there<｜Assistant｜>" in t
    assert "--- generated (" in t


def test_serve_bad_flag_exits_2(tmp_path):
    env = installed_env()
    r = subprocess.run([sys.executable, "-m", "ds4.cli", "serve", "--ctx", "0"], capture_output=True, text=True,
                       env=env, timeout=DEADLINE)
    assert r.returncode == 2 and "--ctx" in r.stderr


def test_serve_unavailable_backend_exits_2(tmp_path):
    env = installed_env()
    r = subprocess.run([sys.executable, "-m", "ds4.cli", "serve", "--metal", "--port", "0"], capture_output=True,
                       text=True, env=env, timeout=DEADLINE)
    assert r.returncode == 2 and "metal" in r.stderr
