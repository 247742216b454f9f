"""Live projection of a DSML tool block onto streamed tool-call events (docs/runtime.md §8.5).

While the model writes ``<｜DSML｜tool_calls><｜DSML｜invoke name="f"><｜DSML｜parameter name="k"
string="true">v</｜DSML｜parameter></｜DSML｜invoke>...``, :class:`ToolProjection` turns the bytes
seen so far into events: ``("start", index, name)`` once an invoke tag is complete, ``("args",
index, fragment)`` pieces of the JSON arguments object (``{``, ``"k":"``, the escaped value, ``"``,
``}``), and ``("end", index)`` at the invoke's closing tag. It holds back a partial closing tag, a
partial ``&...;`` entity and an incomplete UTF-8 character. Anything unexpected (including a
parameter without a ``string`` attribute) stops the projection; the final parser still decides
what the calls are, and calls that were not streamed are sent whole at the end.
"""

from __future__ import annotations

import json

from ..dsml import dsml_attr, dsml_unescape  # the final parser's attribute / entity rules
from .textscan import C_SPACE, TOOL_SYNTAXES_UTF8 as _SYNTAXES, utf8_safe_len

__all__ = ["ToolProjection"]

_ENTITIES = (b"&amp;", b"&lt;", b"&gt;", b"&quot;", b"&apos;")
_BETWEEN_INVOKES, _BETWEEN_PARAMS, _VALUE = "invokes", "params", "value"


def _partial(raw: bytes, pos: int, lit: bytes) -> bool:
    """``raw[pos:]`` is a proper prefix of ``lit`` (the tag is still arriving)."""
    tail = raw[pos:]
    return len(tail) < len(lit) and lit.startswith(tail)


def _entity_safe(raw: bytes, start: int, limit: int) -> int:
    """Pull ``limit`` back before a trailing partial entity such as ``&am``."""
    amp = raw.rfind(b"&", max(start, limit - 6), limit)
    if amp >= 0:
        tail = raw[amp:limit]
        if any(len(tail) < len(e) and e.startswith(tail) for e in _ENTITIES):
            return amp
    return limit


def _json_fragment(s: str) -> str:
    """``s`` escaped for the inside of a JSON string (no surrounding quotes)."""
    return json.dumps(s, ensure_ascii=False)[1:-1]


class ToolProjection:
    """Incremental DSML-block -> tool-call events translator. ``raw`` must grow append-only."""

    def __init__(self, raw: bytes, pos: int) -> None:
        self.active = False
        self.index = 0
        self.emitted_any = False
        self._args_open = False
        self._first_param = True
        self._is_string = False
        self._state = _BETWEEN_INVOKES
        for syn in _SYNTAXES:
            if raw.startswith(syn[0], pos):
                self._syn = syn
                self._pos = pos + len(syn[0])
                self.active = True
                break

    @property
    def done(self) -> bool:
        return not self.active

    def _fail(self) -> list:
        self.active = False
        return []

    def update(self, raw: bytes) -> list[tuple]:
        """Events for the bytes of ``raw`` not seen before."""
        if not self.active:
            return []
        _, tc_end, inv_start, inv_end, par_start, par_end = self._syn
        out: list[tuple] = []
        n = len(raw)
        while self.active and self._pos < n:
            if self._state in (_BETWEEN_INVOKES, _BETWEEN_PARAMS):
                while self._pos < n and raw[self._pos] in C_SPACE:
                    self._pos += 1
                if self._pos >= n:
                    break
                if self._state == _BETWEEN_INVOKES:
                    if raw.startswith(tc_end, self._pos):
                        self._pos += len(tc_end)
                        self.active = False
                        break
                    if _partial(raw, self._pos, tc_end) or _partial(raw, self._pos, inv_start):
                        break
                    if not raw.startswith(inv_start, self._pos):
                        return out + self._fail()
                    gt = raw.find(b">", self._pos)
                    if gt < 0:
                        break
                    name = dsml_attr(raw[self._pos:gt + 1].decode("utf-8", "replace"), "name")
                    if name is None:
                        return out + self._fail()
                    out += [("start", self.index, name), ("args", self.index, "{")]
                    self.emitted_any = True
                    self._args_open, self._first_param = True, True
                    self._pos = gt + 1
                    self._state = _BETWEEN_PARAMS
                    continue
                if raw.startswith(inv_end, self._pos):
                    if self._args_open:
                        out.append(("args", self.index, "}"))
                    out.append(("end", self.index))
                    self._args_open = False
                    self._pos += len(inv_end)
                    self.index += 1
                    self._state = _BETWEEN_INVOKES
                    continue
                if _partial(raw, self._pos, inv_end) or _partial(raw, self._pos, par_start):
                    break
                if not raw.startswith(par_start, self._pos):
                    return out + self._fail()
                gt = raw.find(b">", self._pos)
                if gt < 0:
                    break
                tag = raw[self._pos:gt + 1].decode("utf-8", "replace")
                name, kind = dsml_attr(tag, "name"), dsml_attr(tag, "string")
                if name is None or kind is None:
                    return out + self._fail()
                self._is_string = kind == "true"
                prefix = ("" if self._first_param else ",") + json.dumps(name, ensure_ascii=False) + ":"
                out.append(("args", self.index, prefix + ('"' if self._is_string else "")))
                self._first_param = False
                self._pos = gt + 1
                self._state = _VALUE
                continue
            # inside a parameter value
            end = raw.find(par_end, self._pos)
            if end >= 0:
                out += self._value(raw, self._pos, end)
                if self._is_string:
                    out.append(("args", self.index, '"'))
                self._pos = end + len(par_end)
                self._state = _BETWEEN_PARAMS
                continue
            limit = n
            lt = raw.rfind(b"<", max(self._pos, n - len(par_end)), n)
            if lt >= 0 and _partial(raw, lt, par_end):
                limit = lt
            if self._is_string:
                limit = _entity_safe(raw, self._pos, limit)
            limit = utf8_safe_len(raw, self._pos, limit)
            if limit > self._pos:
                out += self._value(raw, self._pos, limit)
                self._pos = limit
            break
        return out

    def _value(self, raw: bytes, a: int, b: int) -> list[tuple]:
        if b <= a:
            return []
        text = raw[a:b].decode("utf-8", "replace")
        frag = _json_fragment(dsml_unescape(text)) if self._is_string else text
        return [("args", self.index, frag)]
