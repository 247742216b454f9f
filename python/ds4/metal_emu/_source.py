"""Reading metal/*.metal for the emulator: kernel signatures, function constants, the few
line-preserving rewrites clang needs, and the generated thunks.

A thunk turns a kernel's Metal argument attributes into C++ arguments: ``[[buffer(i)]]`` reads
binding i, ``[[threadgroup(i)]]`` the i-th threadgroup allocation, and the position attributes
(``[[thread_position_in_grid]]``, ``[[thread_index_in_simdgroup]]``, ...) the thread's ids. The
same pass decides, conservatively, which kernels can run without fibers: those whose body, and
the bodies of the functions it calls (by name, transitively), mention no barrier, simd
collective or simdgroup matrix operation. The runtime fails a dispatch that proves it wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import Ds4Error

__all__ = ["MetalSourceError", "Kernel", "FunctionConstant", "MetalFile", "parse_metal", "translation_unit"]


class MetalSourceError(Ds4Error):
    """A .metal file uses a construct the emulator cannot run faithfully (the message says which)."""


# Built-in position attributes -> field of ds4emu::ThreadIds.
_BUILTINS = {
    "thread_position_in_grid": "thread_position_in_grid",
    "thread_position_in_threadgroup": "thread_position_in_threadgroup",
    "threadgroup_position_in_grid": "threadgroup_position_in_grid",
    "threads_per_threadgroup": "threads_per_threadgroup",
    "dispatch_threads_per_threadgroup": "dispatch_threads_per_threadgroup",
    "threadgroups_per_grid": "threadgroups_per_grid",
    "threads_per_grid": "threads_per_grid",
    "thread_index_in_threadgroup": "thread_index_in_threadgroup",
    "thread_index_in_simdgroup": "thread_index_in_simdgroup",
    "simdgroup_index_in_threadgroup": "simdgroup_index_in_threadgroup",
    "simdgroups_per_threadgroup": "simdgroups_per_threadgroup",
    "threads_per_simdgroup": "threads_per_simdgroup",
    "thread_execution_width": "threads_per_simdgroup",
}

# Python struct codes for function constant values, by MSL type.
FC_FORMATS = {"bool": "?", "char": "b", "uchar": "B", "short": "h", "ushort": "H", "int": "i", "uint": "I",
              "int32_t": "i", "uint32_t": "I", "float": "f", "half": "e"}

_SYNC_PREFIXES = ("simd_", "simdgroup_", "quad_")
_SYNC_NAMES = {"threadgroup_barrier"}


@dataclass
class Param:
    type: str
    name: str
    kind: str  # "buffer", "threadgroup", "builtin"
    index: int = -1
    builtin: str = ""


@dataclass
class FunctionConstant:
    index: int
    type: str
    name: str
    line: int


@dataclass
class Kernel:
    name: str
    params: list[Param]
    line: int
    needs_fibers: bool = True
    constants: list[FunctionConstant] = field(default_factory=list)

    @property
    def buffer_indices(self) -> list[int]:
        return [p.index for p in self.params if p.kind == "buffer"]

    @property
    def threadgroup_indices(self) -> list[int]:
        return [p.index for p in self.params if p.kind == "threadgroup"]


@dataclass
class MetalFile:
    path: Path
    text: str            # as written (what Apple's compiler gets)
    rewritten: str       # what clang gets (same line numbers)
    kernels: list[Kernel]
    constants: list[FunctionConstant]


def _strip_comments(text: str) -> str:
    """Comments and string literals blanked, newlines kept (so offsets map to lines)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(c if c == "\n" else " " for c in text[i:j]))
            i = j
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + " " * (min(j, n - 1) - i - 1))
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _matching(text: str, start: int, open_c: str, close_c: str) -> int:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_c:
            depth += 1
        elif text[i] == close_c:
            depth -= 1
            if depth == 0:
                return i
    raise MetalSourceError(f"unbalanced '{open_c}' at offset {start}")


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for c in text:
        if c in "([<":
            depth += 1
        elif c in ")]>":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def _functions(code: str) -> dict[str, set[str]]:
    """Top-level function name -> identifiers in its body (overloads merged)."""
    out: dict[str, set[str]] = {}
    depth, last_boundary, i = 0, 0, 0
    while i < len(code):
        c = code[i]
        if c == "{":
            if depth == 0:
                header = code[last_boundary:i]
                end = _matching(code, i, "{", "}")
                if ")" in header and not re.match(r"\s*(struct|class|union|enum|namespace)\b", header):
                    names = [m for m in re.findall(r"([A-Za-z_]\w*)\s*\(", header)
                             if m not in ("__attribute__", "alignas", "decltype", "sizeof")]
                    if names:
                        out.setdefault(names[0], set()).update(re.findall(r"[A-Za-z_]\w*", code[i:end]))
                i = end + 1
                last_boundary = i
                continue
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == ";" and depth == 0:
            last_boundary = i + 1
        i += 1
    return out


def _closure(funcs: dict[str, set[str]], is_seed) -> set[str]:
    """Functions whose body (transitively) mentions a seed identifier."""
    marked = {f for f, ids in funcs.items() if any(is_seed(x) for x in ids)}
    changed = True
    while changed:
        changed = False
        for f, ids in funcs.items():
            if f not in marked and ids & marked:
                marked.add(f)
                changed = True
    return marked


def _is_sync(ident: str) -> bool:
    return ident in _SYNC_NAMES or ident.startswith(_SYNC_PREFIXES)


_FC_RE = re.compile(r"^(\s*)constant\s+([A-Za-z_]\w*)\s+([A-Za-z_]\w*)\s*\[\[\s*function_constant\s*\(\s*(\d+)\s*\)\s*\]\]\s*;",
                    re.M)
_TG_LOCAL_RE = re.compile(r"^\s*threadgroup\s+[A-Za-z_][\w:]*(\s*<[^>;]*>)?\s+[A-Za-z_]\w*\s*(\[[^\]]*\]\s*)*;", re.M)


def parse_metal(path: Path) -> MetalFile:
    text = path.read_text()
    code = _strip_comments(text)
    name = path.name

    m = _TG_LOCAL_RE.search(code)
    if m:
        raise MetalSourceError(
            f"{name}:{_line_of(code, m.start())}: threadgroup variable declared in a function body; pass "
            "threadgroup memory as a [[threadgroup(i)]] kernel argument (the emulator would give each "
            "thread a private copy)")

    constants = [FunctionConstant(int(m.group(4)), m.group(2), m.group(3), _line_of(code, m.start()))
                 for m in _FC_RE.finditer(code)]
    for fc in constants:
        if fc.type not in FC_FORMATS:
            raise MetalSourceError(f"{name}:{fc.line}: function constant type {fc.type} is not supported")

    kernels = []
    for m in re.finditer(r"\bkernel\s+void\s+([A-Za-z_]\w*)\s*\(", code):
        before = code[max(0, m.start() - 200):m.start()]
        if re.search(r"template\s*<[^;{}]*>\s*$", before):
            raise MetalSourceError(f"{name}:{_line_of(code, m.start())}: kernel {m.group(1)} is a template; "
                                   "write plain kernels that call template helpers")
        open_at = m.end() - 1
        close_at = _matching(code, open_at, "(", ")")
        params, n_buffers = [], 0
        for raw in _split_top(code[open_at + 1:close_at]):
            raw = " ".join(raw.split())
            attr = re.search(r"\[\[\s*([A-Za-z_]\w*)\s*(?:\(\s*(\d+)\s*\))?\s*\]\]\s*$", raw)
            decl = raw[:attr.start()].strip() if attr else raw
            pm = re.match(r"^(.*?)([A-Za-z_]\w*)$", decl)
            if not pm:
                raise MetalSourceError(f"{name}: kernel {m.group(1)}: cannot read parameter '{raw}'")
            ptype, pname = pm.group(1).strip(), pm.group(2)
            what = attr.group(1) if attr else "buffer"
            if what == "buffer":
                idx = int(attr.group(2)) if attr and attr.group(2) else n_buffers
                n_buffers += 1
                params.append(Param(ptype, pname, "buffer", idx))
            elif what == "threadgroup":
                params.append(Param(ptype, pname, "threadgroup", int(attr.group(2) or 0)))
            elif what in _BUILTINS:
                params.append(Param(ptype, pname, "builtin", builtin=_BUILTINS[what]))
            else:
                raise MetalSourceError(f"{name}: kernel {m.group(1)}: attribute [[{what}]] is not emulated")
        kernels.append(Kernel(m.group(1), params, _line_of(code, m.start())))

    funcs = _functions(code)
    sync = _closure(funcs, _is_sync)
    for k in kernels:
        k.needs_fibers = k.name in sync
        k.constants = [fc for fc in constants if fc.name in _reach(funcs, k.name)]

    rewritten = text.replace("#include <metal_stdlib>", "")
    rewritten = re.sub(r"\[\[\s*threadgroup\s*\(", "[[ds4emu_threadgroup(", rewritten)
    # Function constants become per-file globals the runtime sets before a dispatch.
    rewritten = _FC_RE.sub(lambda m: f"{m.group(1)}static {m.group(2)} {m.group(3)};", rewritten)
    return MetalFile(path, text, rewritten, kernels, constants)


def _reach(funcs: dict[str, set[str]], start: str) -> set[str]:
    """Every identifier reachable from function `start` through calls to other functions."""
    seen, todo, ids = {start}, [start], set()
    while todo:
        f = todo.pop()
        for x in funcs.get(f, ()):
            ids.add(x)
            if x in funcs and x not in seen:
                seen.add(x)
                todo.append(x)
    return ids


def translation_unit(mf: MetalFile, emu_dir: Path) -> str:
    """The C++ file clang compiles for one .metal file: the rewritten source, then the thunks."""
    stem = re.sub(r"\W", "_", mf.path.stem)
    out = ['#include "msl_emu.h"', f'#line 1 "{mf.path.as_posix()}"', mf.rewritten, "",
           f'#line 1 "{mf.path.name}.thunks"', "namespace {"]
    for fc in mf.constants:
        out.append(f'ds4emu::FunctionConstant ds4emu_fc_{fc.name} = {{{fc.index}, "{fc.name}", "{fc.type}", '
                   f"sizeof({fc.type}), &{fc.name}}};")
    infos = []
    for k in mf.kernels:
        args = []
        for p in k.params:
            if p.kind == "buffer":
                args.append(f"ds4emu::bind_buffer<{p.type}>(c.buffers[{p.index}])")
            elif p.kind == "threadgroup":
                args.append(f"reinterpret_cast<{p.type}>(c.tg_mem[{p.index}])")
            else:
                args.append(f"ds4emu::bind_id<{p.type}>(c.ids->{p.builtin})")
        out.append(f"void ds4emu_thunk_{k.name}(const ds4emu::ThreadCtx& c) {{")
        out.append(f"    {k.name}(" + ",\n        ".join(args) + ");")
        out.append("}")
        fcs = ", ".join(f"&ds4emu_fc_{fc.name}" for fc in k.constants)
        out.append(f"const ds4emu::FunctionConstant* const ds4emu_fcs_{k.name}[] = {{{fcs}{', ' if fcs else ''}nullptr}};")
        bmask = sum(1 << i for i in k.buffer_indices)
        tmask = sum(1 << i for i in k.threadgroup_indices)
        infos.append(f'    {{"{k.name}", &ds4emu_thunk_{k.name}, {"true" if k.needs_fibers else "false"}, '
                     f'{bmask}ull, {tmask}u, ds4emu_fcs_{k.name}, "{mf.path.name}"}},')
    if infos:
        out.append(f"const ds4emu::KernelInfo ds4emu_kernels_{stem}[] = {{")
        out.extend(infos)
        out.append("};")
        out.append(f"const int ds4emu_registered_{stem} = ds4emu::register_kernels(ds4emu_kernels_{stem}, "
                   f"{len(infos)});")
    out.append("}  // namespace")
    return "\n".join(out) + "\n"
