"""Per-token Python overhead of ``ds4.generation.generate`` (everything but the model).

The model is replaced by an instant session (``eval`` only moves a logit peak, ``logits`` is a
fixed array), so the measured microseconds per generated token are the generation loop's own
cost: sampling, UTF-8 decoding, stop-string and tool-call tracking, events, cache checks. Each
case runs at two lengths; a per-token cost that grows with the length is O(n) work per token.

    PYTHONPATH=python python bench/generation.py                 # table
    PYTHONPATH=python python bench/generation.py --quick
    PYTHONPATH=python python bench/generation.py --json out.json --baseline old.json

The tiny model's tokenizer is used (vocab 512, ids whose bytes are plain ASCII letters are
emitted); ``--vocab`` pads the logits to a real model's vocabulary size (argmax/sampling cost
scales with it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "python"), str(HERE)]

from _common import add_common_args, machine_info, measure, report  # noqa: E402


class InstantSession:
    """Session API with no model: the logits peak moves through ``cycle`` on every eval."""

    def __init__(self, engine, ctx: int) -> None:
        self.engine, self.ctx = engine, ctx
        self._tokens: list[int] = []
        self._logits = np.full(engine.n_vocab, -20.0, dtype=np.float32)
        self._peak = 0

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    @property
    def pos(self) -> int:
        return len(self._tokens)

    @property
    def logits(self) -> np.ndarray:
        return self._logits

    def _move(self) -> None:
        cyc = self.engine.cycle
        self._logits[cyc[self._peak % len(cyc)]] = -20.0
        self._peak += 1
        self._logits[cyc[self._peak % len(cyc)]] = 20.0

    def sync(self, tokens, progress=None) -> None:
        self._tokens = [int(t) for t in tokens]
        self._move()

    def eval(self, token: int) -> None:
        self._tokens.append(int(token))
        self._move()


class InstantEngine:
    def __init__(self, tokenizer, n_vocab: int) -> None:
        self.tokenizer = tokenizer
        self.n_vocab = max(n_vocab, tokenizer.n_vocab)
        letters = [i for i in range(tokenizer.n_vocab)
                   if tokenizer.token_to_bytes(i).isalpha() and tokenizer.token_to_bytes(i).isascii()]
        self.cycle = letters[:50] or [0]

    def session(self, ctx: int = 32768) -> InstantSession:
        return InstantSession(self, ctx)


def per_token_us(engine, n: int, repeats: int, **kw) -> list[float]:
    from ds4.generation import generate

    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fin = generate(engine, prompt="hello", max_tokens=n, ctx=n + 64, seed=1, think="none", stream=False, **kw)
        dt = time.perf_counter() - t
        assert len(fin.tokens) == n, (len(fin.tokens), fin.finish_reason)
        out.append(dt / n * 1e6)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--vocab", type=int, default=512, help="logits size (129280 for the real models)")
    p.add_argument("--lengths", default="1000,8000", help="generated tokens per run (comma list)")
    args = p.parse_args()
    import ds4.testing
    from ds4.kvcache import KVCache
    from ds4.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(ds4.testing.default_model_path())
    engine = InstantEngine(tok, args.vocab)
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.quick:
        lengths = [min(n, 2000) for n in lengths]
    repeats = 2 if args.quick else args.repeats
    kvdir = tempfile.mkdtemp(prefix="ds4-bench-gen-")
    cases = {
        "greedy": dict(temperature=0.0),
        "sampled T=1": dict(temperature=1.0),
        "greedy+stop": dict(temperature=0.0, stop=["<never appears>", "zzzzzzzzzzzzz"]),
        "greedy+dsml": dict(temperature=0.0, dsml=True),
        "greedy+kv_cache": dict(temperature=0.0, kv_cache=KVCache(kvdir, min_tokens=10**6, cold_max_tokens=0)),
    }
    results, rows = [], []
    for label, kw in cases.items():
        for n in lengths:
            name = f"{label} n={n} vocab={engine.n_vocab}"
            r = measure(name, "us/token", per_token_us(engine, n, repeats, **kw), vocab=engine.n_vocab, tokens=n)
            results.append(r)
            rows.append({"case": label, "tokens": n, "us/token": r.median, "spread": f"{r.min:.3g}-{r.max:.3g}",
                         "_names": {"us/token": name}})
    report(results, machine_info(n_vocab=engine.n_vocab), args, ["case", "tokens", "us/token", "spread"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
