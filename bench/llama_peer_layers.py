"""Where ds4 and llama.cpp diverge: per-layer differences of the same prompt (docs/llama-peer.md).

    PYTHONPATH=python python bench/llama_peer_layers.py --model small --tokens 16,512
    PYTHONPATH=python python bench/llama_peer_layers.py --model tiny --tokens 64 --yardstick

For each prompt length, both engines evaluate the same random ids on an empty context; llama.cpp
dumps its per-layer attention output (`attn_out-N`, after `attn_output_b`) and FFN output
(`ffn_out-N`, routed + shared experts) through bench/llama_peer_driver.cpp's LLAMA_PEER_DUMP, ds4
records the same two vectors with its activation tap (docs/steering.md). Printed per layer: the
relative L2 difference of the last token's vector, the median over tokens and the worst token.
`--yardstick` also runs ds4 on its scalar path (DS4_SIMD=scalar, slow) and prints how far ds4's own
SIMD and scalar logits are apart: the spread two correct float orders give on the same model.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _llama_cpp import build_llama, default_root  # noqa: E402
from llama_peer import llama_model, resolve_model  # noqa: E402

COMPONENTS = ("attn_out", "ffn_out")


def rel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Relative L2 difference of b from a along the last axis."""
    return np.linalg.norm(a - b, axis=-1) / np.maximum(np.linalg.norm(a, axis=-1), 1e-30)


def top10(a: np.ndarray, b: np.ndarray) -> int:
    return len(set(np.argsort(-a)[:10].tolist()) & set(np.argsort(-b)[:10].tolist()))


def ds4_run(model: Path, ids: list[int], threads: int, ctx: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    import ds4

    s = ds4.Engine(str(model), threads=threads).session(ctx=ctx)
    with s.capture(*COMPONENTS) as cap:
        s.sync(ids)
    return np.asarray(s.logits, np.float32), {c: cap[c] for c in COMPONENTS}


def llama_run(driver: Path, lmodel: Path, ids_path: Path, n: int, threads: int, ctx: int, fa: bool,
              out: Path) -> tuple[np.ndarray, dict[str, list[np.ndarray]]]:
    env = dict(os.environ, LLAMA_PEER_DUMP=str(out), LLAMA_PEER_DUMP_NAMES="attn_out-,ffn_out-")
    logits_path = out / "logits.f32"
    subprocess.run([str(driver), str(lmodel), str(ids_path), str(threads), str(ctx), "1" if fa else "0", str(n), "0",
                    "0", str(logits_path)], env=env, check=True, stdout=subprocess.DEVNULL)
    layers: dict[str, list[np.ndarray]] = {c: [] for c in COMPONENTS}
    for c in COMPONENTS:
        il = 0
        while (out / f"{c}-{il}.f32").is_file():
            layers[c].append(np.fromfile(out / f"{c}-{il}.f32", np.float32).reshape(n, -1))
            il += 1
    return np.fromfile(logits_path, np.float32), layers


def scalar_logits(model: Path, ids: list[int], threads: int, ctx: int) -> np.ndarray:
    """ds4's logits on the scalar path, in a child process (the path is picked at import)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "l.f32"
        code = ("import sys, numpy as np, ds4; s = ds4.Engine(sys.argv[1], threads=int(sys.argv[3])).session("
                "ctx=int(sys.argv[4])); s.sync([int(x) for x in sys.argv[5].split(',')]); "
                "np.asarray(s.logits, np.float32).tofile(sys.argv[2])")
        subprocess.run([sys.executable, "-c", code, str(model), str(out), str(threads), str(ctx),
                        ",".join(map(str, ids))], env=dict(os.environ, DS4_SIMD="scalar"), check=True)
        return np.fromfile(out, np.float32)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="small", help="ds4.testing preset name or a DS4 GGUF path")
    p.add_argument("--experts", default="q2", choices=["q2", "q4"])
    p.add_argument("--tokens", default="16,512", help="prompt lengths (comma list)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--fa", choices=["on", "off"], default="on", help="llama.cpp flash attention")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--yardstick", action="store_true", help="also compare ds4's scalar and SIMD logits")
    args = p.parse_args(argv)
    lens = [int(x) for x in args.tokens.split(",") if x]

    import ds4.inspection

    model = resolve_model(args.model, args.experts)
    root = default_root()
    build = build_llama(root)
    lmodel = llama_model(model, root)
    n_vocab = ds4.inspection.inspect(model).shape.n_vocab
    ids = np.random.default_rng(args.seed).integers(0, n_vocab, max(lens)).astype("<i4")
    with tempfile.TemporaryDirectory() as tmp:
        ids_path = Path(tmp) / "ids.bin"
        ids.tofile(ids_path)
        for n in lens:
            out = Path(tmp) / f"n{n}"
            out.mkdir()
            ll, lay = llama_run(build.driver, lmodel, ids_path, n, args.threads, args.ctx, args.fa == "on", out)
            dl, cap = ds4_run(model, ids[:n].tolist(), args.threads, args.ctx)
            print(f"{model.name}, {n} tokens: logits rel. diff {float(rel(dl, ll)):.3f}, top-10 overlap "
                  f"{top10(dl, ll)}/10, argmax {'same' if dl.argmax() == ll.argmax() else 'differs'}")
            if args.yardstick:
                sl = scalar_logits(model, ids[:n].tolist(), args.threads, args.ctx)
                print(f"  yardstick, ds4 scalar vs SIMD: logits rel. diff {float(rel(sl, dl)):.3f}, "
                      f"top-10 overlap {top10(sl, dl)}/10")
            print("  layer   " + "  ".join(f"{c + ' last/median/max@token':>32s}" for c in COMPONENTS))
            for il in range(cap[COMPONENTS[0]].shape[1]):
                cells = []
                for c in COMPONENTS:
                    if il >= len(lay[c]):
                        cells.append(f"{'(not dumped)':>32s}")
                        continue
                    d = rel(cap[c][:, il], lay[c][il])
                    cells.append(f"{d[-1]:10.3f} {np.median(d):8.3f} {d.max():7.3f}@{int(d.argmax()):<4d}")
                print(f"  {il:5d}   " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
