"""DSML tool-call parser (docs/runtime.md §8.1-§8.2): hand-written cases plus render -> parse round trips."""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from ds4.chat import ParsedMessage, ToolCall, parse_generated, render_tool_calls

BLOCK = (
    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n"
    "<｜DSML｜parameter name=\"cmd\" string=\"true\">ls &amp;&amp; pwd</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"n\" string=\"false\">{ \"a\": [1, 2] }</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
)


def test_thinking_message_with_call():
    m = parse_generated("<think>hmm</think>Sure." + BLOCK, thinking=True)
    assert m == ParsedMessage("Sure.", "hmm", (ToolCall("bash", '{"cmd": "ls && pwd", "n": {"a":[1,2]}}'),), BLOCK)


def test_plain_text_and_reasoning_split():
    assert parse_generated("just text", thinking=False) == ParsedMessage("just text", None)
    assert parse_generated("r</think>c", thinking=True) == ParsedMessage("c", "r")
    assert parse_generated("<think>r</think>c", thinking=False) == ParsedMessage("c", "r")
    # thinking never closed: everything is content (upstream), including the <think> prefix
    assert parse_generated("<think>still thinking", thinking=True) == ParsedMessage("<think>still thinking", None)


def test_dsml_inside_reasoning_is_not_a_call():
    m = parse_generated("I could call" + BLOCK + "</think>no call after all", thinking=True)
    assert m.tool_calls == () and m.content == "no call after all"
    m = parse_generated("thinking" + BLOCK, thinking=True)  # no </think>: no tool parse at all
    assert m.tool_calls == () and m.content == "thinking" + BLOCK and m.reasoning is None


def test_variants_and_defaults():
    short = ("text <DSML｜tool_calls><DSML｜invoke name=\"f\"><DSML｜parameter name=\"x\">a&lt;b"
             "</DSML｜parameter></DSML｜invoke></DSML｜tool_calls> tail")
    m = parse_generated(short, thinking=False)
    assert m.content == "text" and m.tool_calls == (ToolCall("f", '{"x": "a<b"}'),)  # missing string= -> true
    assert m.raw_dsml == short[5:-5]
    xml = "<tool_calls>\n<invoke name=\"g\">\n<parameter name=\"v\" string=\"false\"></parameter>\n</invoke>\n</tool_calls>"
    assert parse_generated(xml, thinking=False).tool_calls == (ToolCall("g", '{"v": null}'),)  # empty -> null
    two = "<｜DSML｜tool_calls><｜DSML｜invoke name=\"a\"></｜DSML｜invoke><｜DSML｜invoke name=\"b\"></｜DSML｜invoke></｜DSML｜tool_calls>"
    assert parse_generated(two, thinking=False).tool_calls == (ToolCall("a", "{}"), ToolCall("b", "{}"))


def test_loose_nesting_recovery():
    text = ("<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"opts\">\n"
            "  <｜DSML｜parameter name=\"k\" string=\"true\">v</｜DSML｜parameter>\n"
            "  <｜DSML｜parameter name=\"n\" string=\"false\">3</｜DSML｜parameter>\n"
            "</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>")
    m = parse_generated(text, thinking=False)
    assert m.tool_calls == (ToolCall("f", '{"opts": {"k":"v","n":3}}'),)


def test_malformed_block_returns_raw_text():
    for bad in ("a\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n",  # unterminated
                "<｜DSML｜tool_calls><oops/></｜DSML｜tool_calls>",
                "<｜DSML｜tool_calls><｜DSML｜invoke></｜DSML｜invoke></｜DSML｜tool_calls>"):  # no name
        m = parse_generated(bad, thinking=False)
        assert m == ParsedMessage(bad, None, (), None, ok=False)


_text = st.text(alphabet=st.characters(blacklist_characters="&", blacklist_categories=("Cs",)), max_size=30)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3), max_leaves=6)
_args = st.dictionaries(_text, st.one_of(_text, _json_value), max_size=4)


@given(st.lists(st.tuples(_text.filter(bool), _args), min_size=1, max_size=3), _text)
@example([('a<b>"c', {"s": "x</｜DSML｜parameter>y", "j": ["</｜DSML｜parameter>", {"k": 1.5}], "e": ""})], "hi")
def test_render_then_parse_round_trip(calls, content):
    content = content.strip(" \t\n\v\f\r")
    block = render_tool_calls([(name, json.dumps(args, ensure_ascii=False)) for name, args in calls])
    m = parse_generated(content + block, thinking=False)
    if "<tool_calls>" in content or "DSML｜tool_calls>" in content or "</think>" in content:
        return  # the content itself looks like a block or a reasoning split; not this test's subject
    assert m.ok and m.content == content and m.raw_dsml == block
    assert [c.name for c in m.tool_calls] == [n for n, _ in calls]
    assert [json.loads(c.arguments) for c in m.tool_calls] == [a for _, a in calls]


# ---- streaming recognizer --------------------------------------------------------------------------

from ds4.chat import DsmlTracker  # noqa: E402

_SYN = [
    ("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜invoke", "</｜DSML｜invoke>", "<｜DSML｜parameter",
     "</｜DSML｜parameter>"),
    ("<DSML｜tool_calls>", "</DSML｜tool_calls>", "<DSML｜invoke", "</DSML｜invoke>", "<DSML｜parameter",
     "</DSML｜parameter>"),
    ("<tool_calls>", "</tool_calls>", "<invoke", "</invoke>", "<parameter", "</parameter>"),
]
WS = " \t\n\v\f\r"


def slow_state(raw: str) -> str:
    """From-scratch recognizer, after upstream's test-only ``dsml_decode_state_for_text``."""
    starts = [(raw.find(s[0]), i) for i, s in enumerate(_SYN) if raw.find(s[0]) >= 0]
    if not starts:
        return "outside"
    k, i = min(starts)
    tc_start, tc_end, inv_start, inv_end, p_start, p_end = _SYN[i]
    pos = k + len(tc_start)

    def partial_suffix(lit, min_len):
        return any(raw.endswith(lit[:n]) for n in range(min_len, min(len(raw), len(lit) - 1) + 1))

    while True:
        while pos < len(raw) and raw[pos] in WS:
            pos += 1
        if pos >= len(raw):
            return "structural"
        if raw.startswith(tc_end, pos):
            return "outside"
        if raw.startswith(inv_end, pos):
            pos += len(inv_end)
            continue
        if raw.startswith(inv_start, pos):
            e = raw.find(">", pos)
            if e < 0:
                return "structural"
            pos = e + 1
            continue
        if raw.startswith(p_start, pos):
            e = raw.find(">", pos)
            if e < 0:
                return "structural"
            tag = raw[pos:e + 1]
            is_string = 'string="true"' in tag
            pos = e + 1
            if is_string:
                end = raw.find(p_end, pos)
                if end < 0:
                    return "structural" if partial_suffix(p_end, 2) else "string_body"
                pos = end + len(p_end)
                continue
            in_str = esc = False
            q = pos
            closed = False
            while q < len(raw):
                if not in_str and raw.startswith(p_end, q):
                    closed = True
                    break
                c = raw[q]
                q += 1
                if in_str:
                    if esc:
                        esc = False
                    elif c == "\\":
                        esc = True
                    elif c == '"':
                        in_str = False
                elif c == '"':
                    in_str = True
            if closed:
                pos = q + len(p_end)
                continue
            if not in_str and partial_suffix(p_end, 2):
                return "structural"
            return "json_string" if in_str else "json_structural"
        return "structural"


def test_tracker_states_on_a_block():
    text = ("Hi" + BLOCK + " after")
    tr = DsmlTracker()
    seen = []
    for i in range(1, len(text) + 1):
        st = tr.update(text[:i])
        if not seen or seen[-1] != st:
            seen.append(st)
    assert seen == ["outside", "structural", "string_body", "structural", "json_structural", "json_string",
                    "json_structural", "structural", "outside"]
    assert tr.done and not tr.in_tool and not tr.greedy


@given(st.lists(st.tuples(_text.filter(bool), _args), min_size=1, max_size=2), _text,
       st.lists(st.integers(1, 6), min_size=1, max_size=40))
def test_tracker_incremental_equals_from_scratch(calls, prefix, steps):
    block = render_tool_calls([(name, json.dumps(args, ensure_ascii=False)) for name, args in calls])
    text = prefix.replace("<", "(") + block + "tail"
    tr = DsmlTracker()
    pos = 0
    for k in steps * (len(text) // max(sum(steps), 1) + 1):
        pos = min(len(text), pos + k)
        assert tr.update(text[:pos]) == slow_state(text[:pos]), text[:pos]
        if pos == len(text):
            break


def test_public_dsml_attribute_and_entity_helpers():
    from ds4.chat import dsml_attr, dsml_unescape

    assert dsml_unescape("a &lt;b&gt; &amp;amp; &quot;q&quot; &apos;s&apos; & &x;") == "a <b> &amp; \"q\" 's' & &x;"
    tag = '<｜DSML｜parameter name="a&amp;b" string="true">'
    assert dsml_attr(tag, "name") == "a&b"
    assert dsml_attr(tag, "string") == "true"
    assert dsml_attr(tag, "missing") is None
    assert dsml_attr('<x name="unterminated>', "name") is None
