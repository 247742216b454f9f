"""The generation loop's incremental pieces against naive whole-text oracles.

``StopMatcher`` keeps only the held-back text and ``ToolBlockWatch`` scans only new text (ds4.decoding), so a
token costs the same at any length (bench/generation.py); these properties check that they give
exactly the answers of rescanning the whole text after every token.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ds4.decoding import BLOCK_MARKERS as _BLOCK_MARKERS, StopMatcher as _StopMatcher, ToolBlockWatch as _ToolBlockWatch

ALPHABET = st.sampled_from(list("abc<>/|\n") + ["é", "｜"])
PIECE = st.lists(ALPHABET, max_size=4).map("".join)


def naive_stops(deltas: list[str], stops: list[str]) -> tuple[list[str], str | None, int]:
    """Released text per push, the matched stop and where it starts, from the whole text each time."""
    stops = [s for s in stops if s]
    longest = max((len(s) for s in stops), default=0)
    text, released, out = "", 0, []
    for d in deltas:
        text += d
        hits = [(text.find(s), i, s) for i, s in enumerate(stops) if s in text]
        if hits:
            pos, _, s = min(hits)
            out.append(text[released:pos])
            return out, s, pos
        hold = 0
        for k in range(1, min(len(text) - released, longest - 1) + 1):
            if any(s.startswith(text[-k:]) for s in stops):
                hold = k
        out.append(text[released:len(text) - hold])
        released = len(text) - hold
    out.append(text[released:])
    return out, None, -1


@given(st.lists(PIECE, max_size=25), st.lists(st.lists(ALPHABET, min_size=0, max_size=4).map("".join), max_size=3))
def test_stop_matcher_equals_whole_text_rescan(deltas, stops):
    m = _StopMatcher(stops)
    want, want_stop, want_pos = naive_stops(deltas, stops)
    got = []
    stop = None
    for d in deltas:
        out, stop = m.push(d)
        got.append(out)
        assert len(m.held) < max(m.max_len, 1) or stop is not None  # bounded, whatever was pushed
        if stop is not None:
            break
    if stop is None:
        got.append(m.reset())
    assert got == want and stop == want_stop
    if stop is not None:
        assert m.released == want_pos


def naive_block_closed(text: str, start: int) -> bool:
    for open_tag, close_tag in _BLOCK_MARKERS:
        k = text.find(open_tag, start)
        if k >= 0 and text.find(close_tag, k + len(open_tag)) >= 0:
            return True
    return False


MARKER_BITS = st.sampled_from([t for pair in _BLOCK_MARKERS for t in pair]
                              + ["<｜DSML｜", "tool_calls>", "</", "<", "x", "\n\n"])


@given(st.lists(MARKER_BITS, max_size=12), st.lists(st.integers(1, 6), min_size=1, max_size=30),
       st.integers(0, 5))
def test_tool_block_watch_equals_whole_text_rescan(bits, cuts, start):
    whole = "".join(bits)
    text = whole[:start]
    start = len(text)
    w = _ToolBlockWatch(start)
    i, c = start, 0
    while i < len(whole):
        i = min(len(whole), i + cuts[c % len(cuts)])  # arbitrary token boundaries, even inside markers
        c += 1
        text = whole[:i]
        got = w.closed(text)
        assert got == naive_block_closed(text, start), (text, start)
        if got:
            break
