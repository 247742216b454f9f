"""``ds4 steering build --good FILE --bad FILE --component ffn_out|attn_out --out NAME``.

Builds a directional-steering file from two prompt sets (:mod:`ds4.steering_build`): writes
``NAME.f32`` (upstream's runtime format, for ``--dir-steering-file``) and ``NAME.json`` (how it
was built). ``ds4 steering info FILE`` prints a file's shape, norms and metadata.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("steering", help="build and inspect directional-steering files",
                              description="Directional steering files (docs/steering.md).")
    sub = p.add_subparsers(dest="steering_command", metavar="ACTION")
    b = sub.add_parser("build", help="build a direction file from target and contrast prompts",
                       description="Capture one layer component at the last token of each prompt (rendered "
                                   "as a chat turn), take target-minus-contrast means per layer, normalise, "
                                   "and write NAME.f32 + NAME.json.")
    b.add_argument("-m", "--model", default=None, help="GGUF model (default: the bundled tiny synthetic model)")
    b.add_argument("--good", "--good-file", dest="good", required=True, metavar="FILE",
                   help="target prompts, one per line ('#' comments)")
    b.add_argument("--bad", "--bad-file", dest="bad", required=True, metavar="FILE",
                   help="contrast prompts, one per line")
    b.add_argument("--component", choices=("ffn_out", "attn_out"), default="ffn_out",
                   help="which layer output to capture (default ffn_out)")
    b.add_argument("--out", required=True, metavar="NAME", help="output stem: NAME.f32 and NAME.json")
    b.add_argument("-c", "--ctx", type=int, default=512, metavar="N", help="session context (default 512)")
    b.add_argument("-sys", "--system", default="You are a helpful assistant.",
                   help='system text (default "You are a helpful assistant."; "" disables)')
    b.add_argument("--think", action="store_true", help="capture after <think> (default: direct answers)")
    b.add_argument("--pair-normalize", action="store_true", help="average normalised per-pair differences")
    b.add_argument("--no-orthogonalize", action="store_true",
                   help="keep the part parallel to the contrast mean")
    b.add_argument("-t", "--threads", type=int, default=None, metavar="N", help="CPU threads")
    b.add_argument("--progress", action="store_true", help="always show the progress bar")
    b.set_defaults(func=run_build)
    i = sub.add_parser("info", help="shape, per-layer norms and metadata of a direction file")
    i.add_argument("file", metavar="FILE.f32")
    i.add_argument("-m", "--model", default=None, help="check the file against this model's shape")
    i.set_defaults(func=run_info)
    p.set_defaults(func=lambda args: (p.print_help(sys.stderr), 2)[1])


def run_build(args: argparse.Namespace) -> int:
    from ..engine import Engine
    from ..errors import InvalidArgumentError
    from ..steering_build import build_steering, read_prompt_file
    from ..testing import default_model_path
    from .generate import ProgressBar

    good, bad = read_prompt_file(args.good), read_prompt_file(args.bad)
    if len(good) != len(bad):
        print(f"ds4: {len(good)} target and {len(bad)} contrast prompts: using the first "
              f"{min(len(good), len(bad))} pairs", file=sys.stderr)
    if args.ctx < 2:
        raise InvalidArgumentError(f"--ctx must be at least 2, got {args.ctx}")
    engine = Engine(args.model if args.model is not None else default_model_path(), threads=args.threads)
    bar = ProgressBar(enabled=True if args.progress else None, min_total=1, label="capture", unit="prompts")
    try:
        res = build_steering(engine, good, bad, args.component, system=args.system or None, think=args.think,
                             ctx=args.ctx, orthogonalize=not args.no_orthogonalize,
                             pair_normalize=args.pair_normalize, progress=bar)
    finally:
        bar.close()
    f32, meta = res.steering.save(args.out, {**res.metadata, "good_file": str(args.good), "bad_file": str(args.bad)})
    print(f"ds4: {res.pairs} prompt pairs, {args.component}, "
          f"{res.steering.directions.shape[0]} x {res.steering.directions.shape[1]}", file=sys.stderr)
    print(f"wrote {meta}")
    print(f"wrote {f32}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    import numpy as np

    from ..steering import Steering

    shape = None
    if args.model is not None:
        from ..inspection import inspect
        shape = inspect(args.model).shape
    st = Steering.from_file(args.file, shape=shape)
    meta_path = st.source.with_suffix(".json") if st.source is not None else None
    meta = None
    if meta_path is not None and meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except ValueError:
            meta = None
    d = st.directions
    print(f"{args.file}: {d.size} floats, shape {list(d.shape) if d.ndim == 2 else '(flat; pass -m MODEL)'}")
    if d.ndim == 2:
        norms = np.linalg.norm(d.astype(np.float64), axis=1)
        print(f"layer norms: min {norms.min():.6f}, max {norms.max():.6f}, zero rows {int((norms == 0).sum())}")
    if meta is not None:
        print(json.dumps(meta, indent=2))
    return 0
