"""The op timeline (DS4_OP_TIMELINE=1, csrc/common/op_timeline.h, bench/decode_timeline.py): a
timed session gives the same logits as an untimed one, records one event per Stream op with the
weight bytes the op reads, and sees the thread pool's hand-offs inside the ops that split work."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np

import ds4
import ds4._core as core
import ds4.testing
from _installed import installed_env

_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import ds4, ds4.testing
    from ds4 import _core
    eng = ds4.Engine(ds4.testing.cached_model("tiny"), threads=2)
    s = eng.session(ctx=64)
    s.sync([1, 2, 3, 4, 5])
    _core.op_timeline_take()
    _core.op_timeline_record(True)
    s.eval(7)
    _core.op_timeline_record(False)
    events = _core.op_timeline_take()
    s.eval(9)                      # not recorded
    print(json.dumps({"wanted": _core.op_timeline_wanted(), "events": events, "late": _core.op_timeline_take(),
                      "logits": np.asarray(s.logits, np.float32).tolist()}))
""")


def _untimed_logits() -> np.ndarray:
    eng = ds4.Engine(ds4.testing.cached_model("tiny"), threads=2)
    s = eng.session(ctx=64)
    s.sync([1, 2, 3, 4, 5])
    s.eval(7)
    s.eval(9)
    return np.asarray(s.logits, np.float32)


def _timed_run() -> dict:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=600,
                         env=installed_env(DS4_OP_TIMELINE="1"))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_timed_decode_matches_and_records_each_op():
    assert not core.op_timeline_wanted()          # this process: no DS4_OP_TIMELINE, nothing wrapped
    r = _timed_run()
    assert r["wanted"]
    np.testing.assert_array_equal(np.asarray(r["logits"], np.float32), _untimed_logits())
    ev = r["events"]
    assert r["late"] == []                         # recording off: the second step left nothing
    eng = ds4.Engine(ds4.testing.cached_model("tiny"), threads=2)
    ops = [e["op"] for e in ev]
    n_layer = eng.shape.n_layer
    # One decode step: per layer two hc_pre / hc_post, one attention and one routed_experts; one head.
    assert ops.count("hc_pre") == 2 * n_layer and ops.count("hc_post") == 2 * n_layer
    assert ops.count("attention") == n_layer and ops.count("routed_experts") == n_layer
    assert ops[0] == "embed_tokens_hc" and ops.count("hc_collapse_norm") == 1
    for a, b in zip(ev, ev[1:]):                   # in order, never overlapping (one calling thread)
        assert a["t0"] <= a["t1"] <= b["t0"]
    head = [e for e in ev if e["op"] == "linear" and e["label"] == "output.weight"]
    assert len(head) == 1
    tensors = eng.info.tensors
    assert head[0]["bytes"] == tensors["output.weight"].nbytes
    # Every layer's weighted ops carry bytes; weightless ones none.
    assert all(e["bytes"] > 0 for e in ev if e["op"] in ("linear", "linear_group", "grouped_output_a",
                                                          "routed_experts", "hc_pre"))
    assert all(e["bytes"] == 0 for e in ev if e["op"] in ("rms_norm", "attention", "hc_post", "add", "router"))
    # Experts: n_used of each of gate, up and down (one expert's share of each stack).
    s = eng.shape
    for e in (e for e in ev if e["op"] == "routed_experts"):
        blk = e["label"].removesuffix("ffn_gate_exps.weight")
        per = sum(tensors[blk + f"ffn_{m}_exps.weight"].nbytes for m in ("gate", "up", "down")) // s.n_expert
        assert e["bytes"] == s.n_expert_used * per
    # Hand-offs are only counted inside ops that split work over the pool, and every counted one
    # has a non-negative wake and tail.
    assert sum(e["handoffs"] for e in ev) > 0
    for e in ev:
        assert e["wake_ns"] >= 0 and e["tail_ns"] >= 0 and e["helper_ns"] >= 0
        assert e["no_helper"] <= e["handoffs"]
        if e["handoffs"] == 0:
            assert e["wake_ns"] == e["tail_ns"] == e["helper_ns"] == 0
