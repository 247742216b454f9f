"""Seeded mutation fuzzing of every file ds4 reads, each case in a child process with limits.

A case is a (mutated file, entry point) pair run in a fresh child forked from a preloaded
forkserver, under RLIMIT_AS (address space) and RLIMIT_CPU, with a wall-clock timeout. The child
reports one outcome:

* ``ok``      the entry point accepted the file (a mutation can be harmless, e.g. a float weight)
* ``ds4``     it raised a ds4.errors.Ds4Error (other than Ds4MemoryError)
* ``foreign`` any other exception: a defect (TypeError, struct.error, OverflowError...)
* ``memory``  MemoryError / Ds4MemoryError: a count from the file was allocated unbounded
* ``crash``   the child died (signal, abort, heap corruption)
* ``hang``    no answer within the wall-clock limit (or killed by RLIMIT_CPU)

Only ``ok`` and ``ds4`` pass. Mutations are chosen by field: every GGUF metadata value and tensor
info, every DSV4 header field and row count, every .kv header field, plus byte flips and
truncations, with "interesting" values (0, 1, 2**31-1, 2**32-1, 2**63, NaN, inf...).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import random
import resource
import shutil
import struct
import traceback
from pathlib import Path
from typing import Any, Callable

# Per case: 3 GiB of address space (a tiny engine needs ~0.5 GiB; the limit turns an unbounded
# allocation into a MemoryError we can see instead of an OOM kill of the machine) and 30 s.
MEM_LIMIT = 3 << 30
CPU_LIMIT = 30
WALL_LIMIT = 60.0

PASSING = ("ok", "ds4")

_ctx = None


def _context():
    global _ctx
    if _ctx is None:
        _ctx = mp.get_context("forkserver")
        _ctx.set_forkserver_preload(["numpy", "ds4", "ds4.engine", "ds4.session", "ds4.kvcache", "ds4.cli",
                                     "ds4.inspection", "_fuzz"])
    return _ctx


def _child(conn, fn: Callable[..., Any], args: tuple) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT, CPU_LIMIT))
    from ds4.errors import Ds4Error, Ds4MemoryError

    try:
        out = ("ok", repr(fn(*args))[:500])
    except (Ds4MemoryError, MemoryError) as e:
        out = ("memory", f"{type(e).__name__}: {e}"[:1000])
    except Ds4Error as e:
        out = ("ds4", f"{type(e).__name__}: {e}"[:1000])
    except BaseException:  # noqa: BLE001 - the point is to report it
        out = ("foreign", traceback.format_exc()[-3000:])
    conn.send(out)
    conn.close()
    os._exit(0)


def run_case(fn: Callable[..., Any], *args: Any) -> tuple[str, str]:
    """Run ``fn(*args)`` in a limited child; (outcome, detail) as described in the module doc."""
    ctx = _context()
    r, w = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(w, fn, args))
    p.start()
    w.close()
    try:
        if r.poll(WALL_LIMIT):
            try:
                return r.recv()
            except EOFError:
                p.join(10)
                return "crash", f"child died with exit code {p.exitcode}"
        return "hang", f"no answer after {WALL_LIMIT} s"
    finally:
        r.close()
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


# ---------------------------------------------------------------- interesting values

U32 = [0, 1, 2, 3, 4, 7, 8, 64, 127, 128, 129, 255, 256, 1024, 65535, 2**31 - 1, 2**31, 2**32 - 1]
U64 = U32 + [2**32, 2**40, 2**63 - 1, 2**63, 2**64 - 1]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, 1e30, 3.4e38, float("inf"), float("-inf"), float("nan")]


def _near(rng: random.Random, v: int, bits: int) -> int:
    pool = (U64 if bits == 64 else U32) + [v - 1, v + 1, v * 2, v // 2]
    return rng.choice([x for x in pool if 0 <= x < 2**bits])


# ---------------------------------------------------------------- GGUF fields

_GGUF_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_fields(data: bytes) -> list[tuple[str, int, str]]:
    """Every mutable field of a GGUF header: (description, offset, struct format)."""
    out: list[tuple[str, int, str]] = [("version", 4, "<I"), ("n_tensors", 8, "<Q"), ("n_kv", 16, "<Q")]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def string(what: str) -> int:
        nonlocal pos
        out.append((f"{what} length", pos, "<Q"))
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
        return n

    for _ in range(n_kv):
        kpos = pos + 8
        klen = string("key")
        key = data[kpos:kpos + klen].decode()
        out.append((f"{key} type", pos, "<I"))
        (vt,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if vt == 8:
            string(f"{key} value")
        elif vt == 9:
            out.append((f"{key} element type", pos, "<I"))
            (sub,) = struct.unpack_from("<I", data, pos)
            out.append((f"{key} count", pos + 4, "<Q"))
            (n,) = struct.unpack_from("<Q", data, pos + 4)
            pos += 12
            if sub == 8:
                for i in range(n):
                    if i < 4:
                        string(f"{key}[{i}]")
                    else:
                        (m,) = struct.unpack_from("<Q", data, pos)
                        pos += 8 + m
            else:
                size = struct.calcsize(_GGUF_FMT[sub])
                for i in range(min(n, 4)):
                    out.append((f"{key}[{i}]", pos + i * size, _GGUF_FMT[sub]))
                pos += n * size
        else:
            out.append((f"{key} value", pos, _GGUF_FMT[vt]))
            pos += struct.calcsize(_GGUF_FMT[vt])
    for _ in range(n_tensors):
        npos = pos + 8
        nlen = string("tensor name")
        name = data[npos:npos + nlen].decode()
        out.append((f"{name} n_dims", pos, "<I"))
        (nd,) = struct.unpack_from("<I", data, pos)
        pos += 4
        for d in range(nd):
            out.append((f"{name} dim{d}", pos, "<Q"))
            pos += 8
        out.append((f"{name} type", pos, "<I"))
        out.append((f"{name} offset", pos + 4, "<Q"))
        pos += 12
    out.append(("header end", pos, ""))
    return out


def _mutate_field(rng: random.Random, data: bytearray, off: int, fmt: str) -> str:
    """Overwrite the field at ``off`` in place with a different interesting value."""
    raw = bytes(data[off:off + struct.calcsize(fmt)])
    (old,) = struct.unpack(fmt, raw)
    code = fmt[1]
    for _ in range(100):
        if code in "fd":
            new: Any = rng.choice(FLOATS + [old * 1.5, -old])
        elif code == "B" and rng.random() < 0.5:
            new = rng.choice([0, 1, 2, 255])
        else:
            bits = struct.calcsize(fmt) * 8
            new = _near(rng, int(old), bits)
            if code.islower() and new >= 2 ** (bits - 1):
                new -= 2**bits
        if struct.pack(fmt, new) != raw:
            break
    struct.pack_into(fmt, data, off, new)
    return f"{old!r} -> {new!r}"


def mutate_gguf(src: bytes, seed: int) -> tuple[bytes, str]:
    rng = random.Random(f"gguf-{seed}")
    fields = gguf_fields(src)
    header_end = fields[-1][1]
    data = bytearray(src)
    r = rng.random()
    if r < 0.45:
        name, off, fmt = rng.choice([f for f in fields[:-1] if "tensor" not in f[0] and " dim" not in f[0]
                                     and " offset" not in f[0] and " n_dims" not in f[0]])
        what = f"metadata {name}: " + _mutate_field(rng, data, off, fmt)
        return bytes(data), what  # mutated in place above
    if r < 0.75:
        name, off, fmt = rng.choice([f for f in fields[:-1] if any(k in f[0] for k in
                                                                   (" dim", " offset", " n_dims", " type"))])
        what = f"tensor info {name}: " + _mutate_field(rng, data, off, fmt)
        return bytes(data), what  # mutated in place above
    if r < 0.9:
        flips = []
        for _ in range(rng.randint(1, 4)):
            off = rng.randrange(4, header_end)
            data[off] ^= 1 << rng.randrange(8)
            flips.append(off)
        return bytes(data), f"bit flips at {flips}"
    cut = rng.choice([rng.randrange(0, header_end), rng.randrange(header_end, len(src))])
    return bytes(data[:cut]), f"truncated to {cut} bytes"


# ---------------------------------------------------------------- DSV4 payload fields

_HEADER_NAMES = ("magic", "version", "ctx", "prefill_cap", "raw_cap", "raw_window", "comp_cap", "tokens",
                 "n_layer", "head_dim", "indexer_head_dim", "n_vocab", "raw_rows")


def mutate_payload(src: bytes, seed: int, n_layer: int, n_vocab: int) -> tuple[bytes, str]:
    rng = random.Random(f"dsv4-{seed}")
    data = bytearray(src)
    tokens = struct.unpack_from("<I", src, 28)[0]
    counts_off = 52 + 4 * tokens + 4 * n_vocab
    r = rng.random()
    if r < 0.45:
        i = rng.randrange(13)
        what = f"header {_HEADER_NAMES[i]}: " + _mutate_field(rng, data, 4 * i, "<I")
        return bytes(data), what  # mutated in place above
    if r < 0.65:
        i = rng.randrange(2 * n_layer)
        what = f"row count {i}: " + _mutate_field(rng, data, counts_off + 4 * i, "<I")
        return bytes(data), what  # mutated in place above
    if r < 0.72:
        i = rng.randrange(tokens)
        what = f"token {i}: " + _mutate_field(rng, data, 52 + 4 * i, "<I")
        return bytes(data), what  # mutated in place above
    if r < 0.8:
        flips = []
        for _ in range(rng.randint(1, 8)):
            off = rng.randrange(len(data))
            data[off] ^= 1 << rng.randrange(8)
            flips.append(off)
        return bytes(data), f"bit flips at {flips}"
    if r < 0.92:
        cut = rng.randrange(len(src))
        return bytes(data[:cut]), f"truncated to {cut} bytes"
    extra = rng.choice([1, 4, 1000])
    return bytes(data) + bytes(extra), f"extended by {extra} bytes"


# ---------------------------------------------------------------- .kv fields

_KV_FIELDS = [("quant_bits", 4, "<B"), ("reason", 5, "<B"), ("ext_flags", 6, "<B"), ("tokens", 8, "<I"),
              ("hits", 12, "<I"), ("ctx", 16, "<I"), ("created_at", 24, "<Q"), ("last_used", 32, "<Q"),
              ("payload_bytes", 40, "<Q"), ("text_bytes", 48, "<I")]


def mutate_kv(src: bytes, seed: int) -> tuple[bytes, str]:
    rng = random.Random(f"kv-{seed}")
    data = bytearray(src)
    text_bytes = struct.unpack_from("<I", src, 48)[0]
    payload_off = 52 + text_bytes
    r = rng.random()
    if r < 0.5:
        name, off, fmt = rng.choice(_KV_FIELDS)
        what = f"kv header {name}: " + _mutate_field(rng, data, off, fmt)
        return bytes(data), what  # mutated in place above
    if r < 0.7:
        i = rng.randrange(13)
        what = f"payload header {_HEADER_NAMES[i]}: " + _mutate_field(rng, data, payload_off + 4 * i, "<I")
        return bytes(data), what  # mutated in place above
    if r < 0.8:
        # a tool-map trailer: flag set and random (often lying) KTM bytes
        data[6] |= 1
        trailer = b"KTM\x01" + struct.pack("<I", rng.choice([1, 3, 2**32 - 1])) + struct.pack(
            "<II", rng.choice([1, 5, 2**32 - 1]), rng.choice([1, 7, 2**31])) + bytes(rng.randrange(64))
        return bytes(data) + trailer, "KTM trailer appended"
    if r < 0.9:
        off = rng.randrange(len(data))
        data[off] ^= 1 << rng.randrange(8)
        return bytes(data), f"bit flip at {off}"
    cut = rng.randrange(len(src))
    return bytes(data[:cut]), f"truncated to {cut} bytes"


# ---------------------------------------------------------------- entry points (run in the child)

def gguf_entry(path: str) -> str:
    import ds4

    ds4.inspect(path)
    eng = ds4.Engine(path, threads=1)
    s = eng.session(ctx=64)
    s.sync([1, 2, 3, 4, 5])
    s.eval(s.argmax())
    return "loaded and ran"


def payload_entry(model: str, path: str, how: str) -> str:
    import ds4
    from ds4.payload import read_payload_info

    eng = ds4.Engine(model, threads=1)
    data = Path(path).read_bytes()
    if how == "load_session":
        s = eng.load_session(path)
    elif how == "load_payload":
        s = eng.session(ctx=256)
        s.load_payload(data)
    else:
        return repr(read_payload_info(data, eng.shape.compress_ratios))
    s.eval(1)
    s.argmax()
    return f"loaded {s.pos} tokens"


def kv_entry(model: str, cache_dir: str, text: str, how: str) -> str:
    if how.startswith("cli"):
        from ds4.cli import main

        argv = {"cli-ls": ["cache", "ls", cache_dir], "cli-ls-json": ["cache", "ls", cache_dir, "--json"],
                "cli-show": ["cache", "show", cache_dir],
                "cli-show-file": ["cache", "show", str(next(Path(cache_dir).glob("*.kv"))), "--json"],
                "cli-rm": ["cache", "rm", cache_dir, "--invalid"]}[how]
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main(argv)
        if rc not in (0, 1) or "Traceback" in err.getvalue():
            raise AssertionError(f"{argv}: exit {rc}: {err.getvalue()}")
        return f"exit {rc}"
    import ds4
    from ds4.kvcache import KVCache

    eng = ds4.Engine(model, threads=1)
    cache = KVCache(cache_dir, min_tokens=32, boundary_trim=4, boundary_align=32)
    s = eng.session(ctx=1024)
    p = cache.prepare(s, text, eng)
    cache.sync(s, p, eng)
    s.argmax()
    return f"{p.source} {p.cached_tokens}"


def write_case(tmp: Path, name: str, data: bytes) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    p = tmp / name
    p.write_bytes(data)
    return p


def copy_dir_with(src_file: Path, dest_dir: Path, data: bytes) -> Path:
    if dest_dir.exists():
        shutil.rmtree(dest_dir)
    dest_dir.mkdir(parents=True)
    (dest_dir / src_file.name).write_bytes(data)
    return dest_dir

