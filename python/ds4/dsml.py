"""DSML tool calls in model output: the final parser (reasoning / content / calls, docs/runtime.md §8.2)
and the streaming recognizer that drives the greedy rule while a block is being generated (§8.3).

The other direction (rendering calls and schemas into a prompt) is :mod:`ds4.chat_template`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .chat_template import _JSON_WS, THINK_END, THINK_START, minify_json

__all__ = [
    "TOOL_SYNTAXES",
    "ToolCall",
    "ParsedMessage",
    "parse_generated",
    "DsmlTracker",
    "dsml_attr",
    "dsml_unescape",
]


# ---- DSML tool-call parsing (model output, docs/runtime.md §8.2) ----------------------------------------

TOOL_SYNTAXES = (
    # the tags of a tool block (block open/close, invoke open/close, parameter open/close) in the
    # three spellings upstream accepts, in its preference order: full DSML, short DSML, plain XML
    ("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜invoke", "</｜DSML｜invoke>",
     "<｜DSML｜parameter", "</｜DSML｜parameter>"),
    ("<DSML｜tool_calls>", "</DSML｜tool_calls>", "<DSML｜invoke", "</DSML｜invoke>",
     "<DSML｜parameter", "</DSML｜parameter>"),
    ("<tool_calls>", "</tool_calls>", "<invoke", "</invoke>", "<parameter", "</parameter>"),
)
_TAGSETS = dict(zip(("dsml", "short", "xml"), TOOL_SYNTAXES))
# Block start markers in upstream's preference order, with the tag set each one selects.
_BLOCK_STARTS = (
    ("\n\n<｜DSML｜tool_calls>", "dsml"), ("<｜DSML｜tool_calls>", "dsml"),
    ("\n\n<DSML｜tool_calls>", "short"), ("<DSML｜tool_calls>", "short"),
    ("\n\n<tool_calls>", "xml"), ("<tool_calls>", "xml"),
)
_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: tool name and its arguments as JSON object text (upstream's ``{"k": v}`` form)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedMessage:
    """Generated text split into reasoning, content and tool calls.

    ``ok`` is False when a tool block was found but malformed: then ``content`` is the whole raw
    text, ``reasoning`` None and no calls (upstream returns the text as an assistant message).
    ``raw_dsml`` is the exact block (from its start marker through the closing tag) for replay.
    """

    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    raw_dsml: str | None = None
    ok: bool = True


def dsml_unescape(s: str) -> str:
    """Decode the five XML entities DSML uses in string parameters and attributes (``&amp;``,
    ``&lt;``, ``&gt;``, ``&quot;``, ``&apos;``); any other ``&`` is kept as is."""
    out, i = [], 0
    entities = (("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&apos;", "'"))
    while True:
        j = s.find("&", i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        out.append(s[i:j])
        for ent, ch in entities:
            if s.startswith(ent, j):
                out.append(ch)
                i = j + len(ent)
                break
        else:
            out.append("&")
            i = j + 1


def dsml_attr(tag: str, name: str) -> str | None:
    """The unescaped value of attribute ``name="..."`` in a DSML tag's text, or None if absent
    or unterminated."""
    pat = name + '="'
    p = tag.find(pat)
    if p < 0:
        return None
    p += len(pat)
    q = tag.find('"', p)
    if q < 0:
        return None
    return dsml_unescape(tag[p:q])


def _json_escape(s: str) -> str:
    out = ['"']
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _minify_raw_value(raw: str) -> str:
    """The first JSON value of ``raw`` minified; ``raw`` unchanged when it does not start with one."""
    i = 0
    while i < len(raw) and raw[i] in _JSON_WS:
        i += 1
    try:
        _, end = json.JSONDecoder().raw_decode(raw, i)
    except ValueError:
        return raw
    return minify_json(raw[i:end])


def _json_member(name: str, value: str, kind: str) -> str:
    if kind == "true":
        return f"{_json_escape(name)}: {_json_escape(value)}"
    m = _minify_raw_value(value or "null")
    return f"{_json_escape(name)}: {m or 'null'}"


def _skip_ws(text: str, p: int) -> int:
    while p < len(text) and text[p] in _C_SPACE:
        p += 1
    return p


def _split_reasoning(text: str) -> tuple[str, str | None]:
    """(content, reasoning): strip one leading <think>; reasoning is what precedes the first </think>."""
    body = text[len(THINK_START):] if text.startswith(THINK_START) else text
    k = body.find(THINK_END)
    if k < 0:
        return text, None
    return body[k + len(THINK_END):], body[:k]


def _parse_leaf_params(text: str, p: int, tags) -> tuple[str, int] | None:
    """Loose nesting recovery: a run of child parameters as a JSON object text."""
    _, _, _, _, param_start, param_end = tags
    members = []
    while True:
        p = _skip_ws(text, p)
        if not text.startswith(param_start, p):
            break
        tag_end = text.find(">", p)
        if tag_end < 0:
            return None
        tag = text[p:tag_end + 1]
        name, kind = dsml_attr(tag, "name"), dsml_attr(tag, "string")
        if name is None:
            return None
        value_end = text.find(param_end, tag_end + 1)
        if value_end < 0:
            return None
        raw = text[tag_end + 1:value_end]
        kind = kind if kind is not None else "true"
        members.append(_json_member(name, dsml_unescape(raw) if kind == "true" else raw, kind))
        p = value_end + len(param_end)
    if not members:
        return None
    return "{" + ", ".join(members) + "}", p


def _parse_block(text: str, start: int, style: str) -> tuple[list[ToolCall], int] | None:
    tc_start, tc_end, inv_start, inv_end, param_start, param_end = tags = _TAGSETS[style]
    p = text.find(tc_start, start)
    if p < 0:
        return None
    p += len(tc_start)
    calls: list[ToolCall] = []
    while True:
        p = _skip_ws(text, p)
        if text.startswith(tc_end, p):
            return calls, p + len(tc_end)
        if not text.startswith(inv_start, p):
            return None
        tag_end = text.find(">", p)
        if tag_end < 0:
            return None
        name = dsml_attr(text[p:tag_end + 1], "name")
        if name is None:
            return None
        p = tag_end + 1
        members: list[str] = []
        while True:
            p = _skip_ws(text, p)
            if text.startswith(inv_end, p):
                p += len(inv_end)
                break
            if not text.startswith(param_start, p):
                return None
            tag_end = text.find(">", p)
            if tag_end < 0:
                return None
            tag = text[p:tag_end + 1]
            pname, kind = dsml_attr(tag, "name"), dsml_attr(tag, "string")
            if pname is None:
                return None
            value_start = tag_end + 1
            if kind is None and text.startswith(param_start, _skip_ws(text, value_start)):
                nested = _parse_leaf_params(text, value_start, tags)
                if nested is None:
                    return None
                obj, p = nested
                members.append(_json_member(pname, obj, "false"))
                p = _skip_ws(text, p)
                if text.startswith(param_end, p):
                    p += len(param_end)
                continue
            value_end = text.find(param_end, value_start)
            if value_end < 0:
                return None
            raw = text[value_start:value_end]
            kind = kind if kind is not None else "true"
            members.append(_json_member(pname, dsml_unescape(raw) if kind == "true" else raw, kind))
            p = value_end + len(param_end)
        calls.append(ToolCall(name, "{" + ", ".join(members) + "}"))


def parse_generated(text: str, thinking: bool) -> ParsedMessage:
    """Split generated text (what follows the prompt's ``<think>``/``</think>``) as upstream's final
    parser does: reasoning before ``</think>``, content, and a DSML tool block after the last
    ``</think>`` (DSML inside reasoning is never a call). Malformed blocks give ``ok=False``."""
    search = 0
    if thinking:
        k = text.rfind(THINK_END)
        if k < 0:
            content, reasoning = _split_reasoning(text)
            return ParsedMessage(content, reasoning)
        search = k + len(THINK_END)
    start, style = -1, ""
    for marker, st in _BLOCK_STARTS:
        start = text.find(marker, search)
        if start >= 0:
            style = st
            break
    if start < 0:
        content, reasoning = _split_reasoning(text)
        return ParsedMessage(content, reasoning)
    parsed = _parse_block(text, start, style)
    if parsed is None:
        return ParsedMessage(text, None, (), None, ok=False)
    calls, end = parsed
    content_end = start
    while content_end > 0 and text[content_end - 1] in _C_SPACE:
        content_end -= 1
    content, reasoning = _split_reasoning(text[:content_end])
    return ParsedMessage(content, reasoning, tuple(calls), text[start:end])


# ---- streaming DSML recognizer (drives the greedy rule, docs/runtime.md §8.3) ---------------------------

_SYNTAXES = TOOL_SYNTAXES
_MAX_START = max(len(s[0]) for s in _SYNTAXES)


def _partial(text: str, pos: int, lit: str, min_len: int = 0) -> bool:
    """``text[pos:]`` is a proper prefix of ``lit`` at least ``min_len`` long (a tag still arriving)."""
    avail = len(text) - pos
    return min_len <= avail < len(lit) and lit.startswith(text[pos:])


class DsmlTracker:
    """Incremental recognizer of where generation is inside a DSML tool block (upstream's
    ``dsml_decode_tracker``): feed it the whole generated text so far after every token.

    ``state`` is one of ``outside``, ``structural`` (tags, whitespace between them, partial tags),
    ``string_body`` (a ``string="true"`` value), ``json_structural`` / ``json_string`` (a
    ``string="false"`` value outside / inside a JSON string). ``greedy`` says the next token is
    protocol syntax and should be chosen greedily. Only the first block of a turn is tracked. It
    scans reasoning too (upstream quirk). Positions are characters, not bytes: a tag cut inside a
    multi-byte character is seen one token later than upstream sees it.
    """

    def __init__(self) -> None:
        self.mode = "search"
        self.state = "outside"
        self._syn = _SYNTAXES[0]
        self._pos = 0
        self._json_in_string = False
        self._json_escaped = False

    @property
    def in_tool(self) -> bool:
        return self.state != "outside"

    @property
    def greedy(self) -> bool:
        return self.state in ("structural", "json_structural")

    @property
    def done(self) -> bool:
        return self.mode == "done"

    def update(self, text: str) -> str:
        """Advance over ``text`` (the full generated text so far); returns the new state."""
        while True:
            if self.mode == "done":
                self.state = "outside"
                return self.state
            if self.mode == "search":
                best, syn = -1, None
                for s in _SYNTAXES:
                    k = text.find(s[0], self._pos)
                    if k >= 0 and (best < 0 or k < best):
                        best, syn = k, s
                if syn is None:
                    self._pos = max(len(text) - _MAX_START, 0)
                    self.state = "outside"
                    return self.state
                self._syn, self._pos = syn, best + len(syn[0])
                self.mode, self.state = "structural", "structural"
            _, tc_end, inv_start, inv_end, param_start, param_end = self._syn
            if self.mode == "string_body":
                while self._pos < len(text):
                    if text.startswith(param_end, self._pos):
                        self._pos += len(param_end)
                        self.mode = "structural"
                        break
                    if _partial(text, self._pos, param_end):
                        # A closing tag may be arriving. Upstream reports structural from 2
                        # characters on but steps past a lone trailing '<' and then never sees
                        # that tag; we keep the position (same states, no lost tag).
                        self.state = "structural" if len(text) - self._pos >= 2 else "string_body"
                        return self.state
                    self._pos += 1
                else:
                    self.state = "string_body"
                    return self.state
            if self.mode == "json":
                closed = False
                while self._pos < len(text):
                    if not self._json_in_string:
                        if text.startswith(param_end, self._pos):
                            self._pos += len(param_end)
                            self.mode = "structural"
                            closed = True
                            break
                        if _partial(text, self._pos, param_end):
                            self.state = "structural" if len(text) - self._pos >= 2 else "json_structural"
                            return self.state
                    c = text[self._pos]
                    self._pos += 1
                    if self._json_in_string:
                        if self._json_escaped:
                            self._json_escaped = False
                        elif c == "\\":
                            self._json_escaped = True
                        elif c == '"':
                            self._json_in_string = False
                    elif c == '"':
                        self._json_in_string = True
                if not closed:
                    self.state = "json_string" if self._json_in_string else "json_structural"
                    return self.state
            # structural
            while self.mode == "structural":
                self._pos = _skip_ws(text, self._pos)
                if self._pos >= len(text):
                    self.state = "structural"
                    return self.state
                if text.startswith(tc_end, self._pos):
                    self._pos += len(tc_end)
                    self.mode = "done"
                    self.state = "outside"
                    return self.state
                if text.startswith(inv_end, self._pos):
                    self._pos += len(inv_end)
                    continue
                if text.startswith(inv_start, self._pos):
                    k = text.find(">", self._pos)
                    if k < 0:
                        self.state = "structural"
                        return self.state
                    self._pos = k + 1
                    continue
                if text.startswith(param_start, self._pos):
                    k = text.find(">", self._pos)
                    if k < 0:
                        self.state = "structural"
                        return self.state
                    is_string = dsml_attr(text[self._pos:k + 1], "string") == "true"
                    self._pos = k + 1
                    if is_string:
                        self.mode, self.state = "string_body", "string_body"
                    else:
                        self.mode, self.state = "json", "json_structural"
                        self._json_in_string = self._json_escaped = False
                    break
                self.state = "structural"  # a partial tag, or anything else: stay structural
                return self.state
