"""Chat rendering golden tests: expected strings are written out by hand from docs/runtime.md §2 and
upstream's server unit tests (test_render_*), never produced by ds4.chat itself."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ds4.chat import (
    append_message,
    encode_chat_prompt,
    normalize_think,
    render,
    render_completion,
    render_tool_calls,
    think_mode_for_context,
)
from ds4.errors import InvalidArgumentError, TokenizerError
from ds4.tokenizer import Tokenizer
from test_tokenizer_fixtures import tiny_vocab, write_vocab_gguf

B, E, U, A = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"

MAX_PREFIX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, "
    "rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)

# docs/runtime.md §2.5, transcribed: {SCHEMAS} replaced by the marker.
TOOLS_BLOCK = """## Tools

You have access to a set of tools to help answer the user question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as raw text and set `string="true"`. Preserve characters such as `>`, `&`, and `&&` exactly; never replace normal string characters with XML or HTML entity escapes. Only if a string value itself contains the exact closing parameter tag `</｜DSML｜parameter>`, write that tag as `&lt;/｜DSML｜parameter>` inside the value. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

TOOL_SCHEMA_MARKER

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls. Use the exact parameter names from the schemas."""


def test_non_thinking_single_user():
    assert render([{"role": "user", "content": "Hello"}], think="none").text == f"{B}{U}Hello{A}</think>"


def test_think_max_prefix_and_system():
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello"}]
    r = render(msgs, think="max")
    assert r.text == f"{B}{MAX_PREFIX}You are terse.{U}Hello{A}<think>"
    assert r.think == "max"
    # below 384 Ki context the max prefix is dropped and the mode is high
    r = render(msgs, think="max", ctx=393215)
    assert r.text == f"{B}You are terse.{U}Hello{A}<think>" and r.think == "high"
    assert render(msgs, think="max", ctx=393216).text.startswith(B + MAX_PREFIX)


def test_drops_old_reasoning_without_tools():
    msgs = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "reasoning_content": "old hidden reasoning", "content": "first answer"},
        {"role": "user", "content": "second"},
    ]
    assert render(msgs, think="high").text == f"{B}{U}first{A}</think>first answer{E}{U}second{A}<think>"
    # thinking off: every assistant turn is closed with </think>
    assert render(msgs, think="none").text == f"{B}{U}first{A}</think>first answer{E}{U}second{A}</think>"


def test_last_assistant_after_last_user_keeps_reasoning():
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "reasoning": "r", "content": "a"}]
    assert render(msgs, think="high").text == f"{B}{U}q{A}<think>r</think>a{E}"


CALL_BLOCK = (
    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n"
    "<｜DSML｜parameter name=\"command\" string=\"true\">pwd</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
)


def test_preserves_reasoning_with_tool_calls():
    msgs = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "reasoning_content": "tool reasoning", "content": "",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "bash", "arguments": "{\"command\":\"pwd\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "/tmp"},
    ]
    expected = f"{B}{U}first{A}<think>tool reasoning</think>{CALL_BLOCK}{E}{U}<tool_result>/tmp</tool_result>{A}<think>"
    assert render(msgs, think="high").text == expected
    # with schemas, the tool prompt heads the system region
    with_tools = render(msgs, tools="TOOL_SCHEMA_MARKER", think="high").text
    assert with_tools == B + TOOLS_BLOCK + expected[len(B):]


def test_tools_before_system():
    msgs = [{"role": "system", "content": "CLIENT_SYSTEM_MARKER"}, {"role": "user", "content": "hello"}]
    text = render(msgs, tools="TOOL_SCHEMA_MARKER", think="high").text
    assert text == f"{B}{TOOLS_BLOCK}\n\nCLIENT_SYSTEM_MARKER{U}hello{A}<think>"


def test_tool_schemas_from_dicts_one_per_line():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}, {"name": "g"}]
    text = render([{"role": "user", "content": "x"}], tools=tools, think="none").text
    assert '### Available Tool Schemas\n\n{"name": "f", "parameters": {}}\n{"name": "g"}\n\nYou MUST' in text


def test_system_join_rules():
    def sys(*parts):
        return render([{"role": "system", "content": p} for p in parts] + [{"role": "user", "content": "u"}],
                      think="none").text

    assert sys("a", "b") == f"{B}a\n\nb{U}u{A}</think>"
    assert sys("", "b") == f"{B}b{U}u{A}</think>"  # separator only after non-empty text
    assert sys("a", "", "b") == f"{B}a\n\n\n\nb{U}u{A}</think>"
    # developer counts as system, wherever it appears
    msgs = [{"role": "user", "content": "u"}, {"role": "developer", "content": "d"}]
    assert render(msgs, think="none").text == f"{B}d{U}u{A}</think>"


def test_consecutive_tool_results_share_a_user_turn_and_escape():
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a", "arguments": "{}"}}]},
        {"role": "tool", "content": "one </tool_result> & <b>"},
        {"role": "function", "content": "two"},
    ]
    text = render(msgs, think="none").text
    block = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    assert text == (f"{B}{U}go{A}</think>{block}{E}{U}<tool_result>one &lt;/tool_result> & <b></tool_result>"
                    f"<tool_result>two</tool_result>{A}</think>")


def test_assistant_without_pending_user_gets_no_marker():
    msgs = [{"role": "assistant", "content": "hi"}, {"role": "assistant", "content": "again"}]
    assert render(msgs, think="high").text == f"{B}hi{E}again{E}"


def test_content_parts_and_unknown_roles():
    msgs = [{"role": "user", "content": ["a", {"type": "text", "text": "b"}, {"type": "image"}]},
            {"role": "narrator", "content": "ignored"}, {"content": None}]
    assert render(msgs, think="none").text == f"{B}{U}ab{U}{A}</think>"


def test_canonical_tool_call_arguments():
    args = '{ "path" : "a</｜DSML｜parameter>b", "n": 1e5, "obj": {"k": [1, 2, "x y"]}, "flag": true }'
    block = render_tool_calls([("read<&>\"", args)])
    assert block == (
        "\n\n<｜DSML｜tool_calls>\n"
        '<｜DSML｜invoke name="read&lt;&amp;&gt;&quot;">\n'
        '<｜DSML｜parameter name="path" string="true">a&lt;/｜DSML｜parameter>b</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="n" string="false">1e5</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="obj" string="false">{"k":[1,2,"x y"]}</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="flag" string="false">true</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    )
    # JSON values keep a closing tag inside a string escaped as \u003c
    assert '["\\u003c/｜DSML｜parameter>"]' in render_tool_calls([("f", '{"v": ["</｜DSML｜parameter>"]}')])
    # not an object: one raw "arguments" string parameter
    assert render_tool_calls([("f", "[1, 2]")]) == (
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
        '<｜DSML｜parameter name="arguments" string="true">[1, 2]</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    )
    assert render_tool_calls([]) == ""
    assert render_tool_calls([("f", "{}")], raw_dsml="<｜DSML｜tool_calls>RAW") == "<｜DSML｜tool_calls>RAW"


def test_tool_call_arguments_as_dict_and_dropped_calls():
    msgs = [{"role": "user", "content": "u"},
            {"role": "assistant", "content": "c", "tool_calls": [
                {"function": {"name": "f", "arguments": {"x": "y"}}},
                {"function": {"name": "no_args"}},
                {"function": {"arguments": "{}"}}]}]
    text = render(msgs, think="none").text
    assert text == (f"{B}{U}u{A}</think>c\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
                    '<｜DSML｜parameter name="x" string="true">y</｜DSML｜parameter>\n'
                    f"</｜DSML｜invoke>\n</｜DSML｜tool_calls>{E}")


def test_raw_dsml_replay():
    raw = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    msgs = [{"role": "user", "content": "u"},
            {"role": "assistant", "content": "", "raw_dsml": raw,
             "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1}"}}]}]
    assert render(msgs, think="none").text == f"{B}{U}u{A}</think>{raw}{E}"


def test_completion_template():
    assert render_completion("hi", think="none").text == f"{B}You are a helpful assistant{U}hi{A}</think>"
    assert render_completion("hi", think="max").text == f"{B}{MAX_PREFIX}You are a helpful assistant{U}hi{A}<think>"


def test_think_modes():
    assert normalize_think(True) == "high" and normalize_think(None) == "none" and normalize_think("MAX") == "max"
    assert think_mode_for_context("max", 0) == "high" and think_mode_for_context("max", -5) == "high"
    assert think_mode_for_context("none", 10**6) == "none"
    with pytest.raises(InvalidArgumentError):
        normalize_think("extreme")


# ---- tokens ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    tokens, merges, types = tiny_vocab()
    return Tokenizer.from_gguf(write_vocab_gguf(tmp_path_factory.mktemp("chat") / "v.gguf", tokens, merges, types))


def test_render_with_tokenizer(tok):
    r = render([{"role": "user", "content": "hello <｜User｜> there"}], think="high", tokenizer=tok)
    assert r.tokens == tok.encode_rendered(r.text)
    assert r.tokens[0] == tok.bos and r.tokens[-2:] == [tok.assistant, tok.think_start]


@given(st.text(max_size=40), st.text(max_size=40), st.sampled_from(["none", "high"]))
def test_engine_encoding_equals_rendered_text_tokens(tok, system, prompt, think):
    # §2.2: outside MAX mode every junction has a special token, so the engine's separate BPE calls
    # equal the rendered-chat tokenization of the same text — when the texts hold no special strings.
    specials = ["<｜", "<think>", "</think>", "｜DSML｜"]
    if any(s in system + prompt for s in specials):
        return
    ids = encode_chat_prompt(tok, prompt, system=system, think=think)
    text = B + system + U + prompt + A + ("<think>" if think == "high" else "</think>")
    assert ids == tok.encode_rendered(text)


def test_engine_encoding_details(tok):
    ids = encode_chat_prompt(tok, "hi", system=None, think="max")
    assert ids == [tok.bos] + tok.encode(MAX_PREFIX) + [tok.user] + tok.encode("hi") + [tok.assistant, tok.think_start]
    assert encode_chat_prompt(tok, "hi", system="", think="max", ctx=1000)[:2] == [tok.bos, tok.user]
    out: list[int] = []
    append_message(tok, out, "assistant", "<think>x")
    assert out == [tok.assistant] + tok.encode("<think>x")  # no </think>, tag stays text (upstream quirk)
    out = []
    append_message(tok, out, "tool", "r")
    assert out == [tok.user] + tok.encode("Tool: ") + tok.encode("r")
    out = []
    append_message(tok, out, "system", "s")
    assert out == tok.encode("s")


def test_missing_special_token_is_reported():
    t = Tokenizer(["a", "b"], [])
    with pytest.raises(TokenizerError, match="begin▁of▁sentence"):
        encode_chat_prompt(t, "a")


def test_content_text_accepts_the_client_content_shapes():
    from ds4.chat import content_text

    assert content_text(None) == ""
    assert content_text("plain") == "plain"
    assert content_text(["a", {"type": "text", "text": "b"}, {"type": "image_url"}, {"text": 3}, 7]) == "ab"
    assert content_text(("x", {"text": "y"})) == "xy"
    assert content_text({"text": "not a list"}) == ""
