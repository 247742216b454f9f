"""Peer benchmark: ds4 against llama.cpp on the same DS4 file, the same token ids, the same threads.

    PYTHONPATH=python python bench/llama_peer.py                          # `small`, 5 rounds, 2 threads
    PYTHONPATH=python python bench/llama_peer.py --model bench --json peer.json
    PYTHONPATH=python python bench/llama_peer.py --model small,bench --json peer.json  # peer-small.json, peer-bench.json
    PYTHONPATH=python python bench/llama_peer.py --model tiny --quick     # smoke run
    PYTHONPATH=python python bench/llama_peer.py --baseline peer.json     # new/old ratios

llama.cpp is the copy inside the llama-cpp-python sdist (bench/_llama_cpp.py builds it once into
the ds4 cache dir, CPU only); the model is converted for it with the metadata fixes of
bench/_llama_gguf.py. Every round runs each engine in its own process, in rotating order (ds4,
llama.cpp flash attention on, llama.cpp flash attention off): load, warm up, prefill 512 and 2048
ids on an empty context (logits of the last position), then 64 greedy decode steps after the first
prompt. The table shows medians over rounds, the paired ratios ds4/llama.cpp (median of the
per-round ratios, so slow phases of a loaded machine cancel), each process's peak RSS, whether the
two engines picked the same greedy tokens, and the machine's load average while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_common_args, machine_info, measure, read_bandwidth, report  # noqa: E402
from _llama_cpp import LLAMA_CPP_PYTHON_VERSION, build_llama, default_root  # noqa: E402
from _llama_gguf import convert_for_llama  # noqa: E402

from ds4 import pagecache  # noqa: E402

DS4_WORKER = Path(__file__).with_name("_peer_ds4.py")
UNITS = {"decode": "tok/s", "peak_rss_MB": "MB"}  # the rest are prefill rates in tok/s
CONVERTER_TAG = "l2"  # bump when _llama_gguf's output changes, so cached conversions are redone


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(p)
    p.set_defaults(repeats=5)
    p.add_argument("--model", default="small",
                   help="ds4.testing preset name or a DS4 GGUF path; a comma list runs each in turn")
    p.add_argument("--experts", default="q2", choices=["q2", "q4"], help="expert mix of a preset model")
    p.add_argument("--prefill", default="512,2048", help="prompt lengths (comma list)")
    p.add_argument("--decode", type=int, default=64, help="greedy decode steps after the first prompt")
    p.add_argument("--ctx", type=int, default=4096, help="context size of both engines")
    p.add_argument("--warmup", type=int, default=32, help="ids evaluated (untimed) before measuring")
    p.add_argument("--fa", default="on,off", help="llama.cpp flash attention settings to run (on,off)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random token ids")
    p.add_argument("--llama-root", type=Path, default=None, help="llama.cpp build folder (default: <ds4 cache>/llama-peer)")
    p.add_argument("--sdist", type=Path, default=None, help="llama-cpp-python sdist (default: found or pip-downloaded)")
    p.add_argument("--build-jobs", type=int, default=2, help="parallel compile jobs for the llama.cpp build")
    p.add_argument("--page-cache", default="huge", choices=["huge", "as-is"],
                   help="huge (default): before the rounds, re-read both engines' files into 2 MiB page-cache "
                        "pages, and before each run read that engine's file through (both engines then map "
                        "their weights with 2 MiB entries); as-is: leave the page cache alone (docs/pagecache.md)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.prefill, args.decode = min(args.repeats, 2), "64,128", 8
    args.prefill_lens = [int(x) for x in args.prefill.split(",") if x]
    args.fa_modes = [m.strip() for m in args.fa.split(",") if m.strip()]
    if not args.prefill_lens or any(n < 1 for n in args.prefill_lens):
        p.error("--prefill needs positive lengths")
    if any(m not in ("on", "off") for m in args.fa_modes):
        p.error("--fa takes on and/or off")
    if args.prefill_lens[0] + args.decode >= args.ctx or max(args.prefill_lens) >= args.ctx:
        p.error("prompts (and the first prompt + decode steps) must fit in --ctx")
    return args


def resolve_model(name: str, experts: str) -> Path:
    if Path(name).is_file():
        return Path(name)
    import ds4.testing

    return ds4.testing.cached_model(name, experts=experts)


def llama_model(src: Path, root: Path) -> Path:
    """The llama.cpp conversion of ``src``, cached next to the build (redone when src changes)."""
    st = src.stat()
    dst = root / "models" / f"{src.stem}-{st.st_size}-{int(st.st_mtime)}-{CONVERTER_TAG}.gguf"
    if not dst.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        fixes = convert_for_llama(src, dst)
        print(f"converted {src.name} for llama.cpp: {'; '.join(fixes) or 'no changes'}", file=sys.stderr)
    return dst


def prepare_page_cache(mode: str, paths: list[Path]) -> list[dict]:
    """Put both engines' files in the same page-cache state before the rounds. How much of a file
    the page cache holds as 2 MiB folios depends on how it got there (written, read(), faulted in),
    and a decode step's speed on whether its weights are mapped with 2 MiB or 4 KiB entries: on the
    development VMs, llama.cpp's converted copy was 30-55 % huge and ds4's file 1 % before this
    (docs/pagecache.md). Returns each file's state (after re-reading it, for "huge")."""
    states = []
    for p in paths:
        st = pagecache.recache(p) if mode == "huge" else pagecache.probe(p)
        print(f"page cache ({mode}): {st}", file=sys.stderr, flush=True)
        states.append(st.to_dict())
    return states


def run_worker(cmd: list[str]) -> dict:
    """Run one measuring process: its JSON output (with its own peak RSS) and the load average."""
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err)  # the worker reports its own peak RSS
        p.wait()
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError(f"{cmd[0]} exited with {p.returncode}: {err.read().decode(errors='replace')[-2000:]}")
        res = json.loads(out.read().decode())
    res["load"] = (load0 + os.getloadavg()[0]) / 2
    return res


def engine_commands(args: argparse.Namespace, model: Path, lmodel: Path, driver: Path, ids: Path,
                    logits_dir: Path) -> dict[str, list[str]]:
    """Command line of each engine's measuring process; each writes its first prompt's logits
    to ``logits_dir/<name>.f32``."""
    common = [str(ids), str(args.threads), str(args.ctx)]
    tail = [",".join(map(str, args.prefill_lens)), str(args.decode), str(args.warmup)]
    cmds = {"ds4": [sys.executable, str(DS4_WORKER), str(model), *common, *tail, str(logits_dir / "ds4.f32")]}
    for m in args.fa_modes:
        name = f"llama_fa_{m}"
        cmds[name] = [str(driver), str(lmodel), *common, "1" if m == "on" else "0", *tail, str(logits_dir / f"{name}.f32")]
    return cmds


def figures(run: dict, prefill_lens: list[int]) -> dict[str, float]:
    out = {f"prefill_{n}": n / run["prefill"][str(n)]["seconds"] for n in prefill_lens}
    steps = run["decode_step_seconds"]
    if steps:
        out["decode"] = len(steps) / sum(steps)
    out["peak_rss_MB"] = run["peak_rss_bytes"] / 1e6
    return out


def agreement(a: dict, b: dict, la: np.ndarray, lb: np.ndarray, prefill_lens: list[int]) -> str:
    """Whether two engines computed the same model: the first prompt's logits (relative RMS
    difference, top-10 overlap), the prefill argmaxes, and the leading greedy tokens they share."""
    rel = float(np.linalg.norm(la - lb) / max(np.linalg.norm(la), 1e-30))
    top = len(set(np.argsort(-la)[:10].tolist()) & set(np.argsort(-lb)[:10].tolist()))
    same = sum(a["prefill"][str(n)]["argmax"] == b["prefill"][str(n)]["argmax"] for n in prefill_lens)
    lead = 0
    for x, y in zip(a["decode_tokens"], b["decode_tokens"]):
        if x != y:
            break
        lead += 1
    return (f"logits rel. RMS diff {rel:.2g}, top-10 overlap {top}/10; prefill argmax {same}/{len(prefill_lens)} same; "
            f"first {lead}/{len(a['decode_tokens'])} greedy tokens same")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = [m for m in args.model.split(",") if m]
    if len(models) > 1 and args.baseline:
        raise SystemExit("--baseline compares one model; run the models one at a time")
    for name in models:
        one = argparse.Namespace(**vars(args))
        if len(models) > 1 and args.json:  # one JSON file per model: peer.json -> peer-small.json, ...
            one.json = args.json.with_name(f"{args.json.stem}-{Path(name).stem}{args.json.suffix}")
        run_model(one, name)
    return 0


def run_model(args: argparse.Namespace, model_name: str) -> None:
    """All rounds on one model, then its table."""
    root = args.llama_root or default_root()
    model = resolve_model(model_name, args.experts)
    build = build_llama(root, args.sdist, jobs=args.build_jobs)
    lmodel = llama_model(model, root)

    import ds4.inspection

    n_vocab = ds4.inspection.inspect(model).shape.n_vocab
    n_ids = max(max(args.prefill_lens), args.warmup)
    ids = np.random.default_rng(args.seed).integers(0, n_vocab, n_ids).astype("<i4")
    read_bw = [read_bandwidth(args.threads, repeats=3).median]  # decode's ceiling, before and after
    with tempfile.TemporaryDirectory() as tmp:
        ids_path = Path(tmp) / "ids.bin"
        ids.tofile(ids_path)
        cmds = engine_commands(args, model, lmodel, build.driver, ids_path, Path(tmp))
        names = list(cmds)
        files = {k: (model if k == "ds4" else lmodel) for k in names}
        cache_states = prepare_page_cache(args.page_cache, sorted(set(files.values())))
        runs: dict[str, list[dict]] = {k: [] for k in names}
        for r in range(args.repeats):
            order = names[r % len(names):] + names[:r % len(names)]  # rotate who goes first
            for name in order:
                if args.page_cache == "huge":
                    pagecache.probe(files[name])  # pages paged out since the last run come back as 2 MiB folios
                runs[name].append(run_worker(cmds[name]))
            if r == 0:
                logits = {k: np.fromfile(Path(tmp) / f"{k}.f32", dtype=np.float32) for k in names}
                agree = {k: agreement(runs["ds4"][0], runs[k][0], logits["ds4"], logits[k], args.prefill_lens)
                         for k in names[1:]}
            line = "  ".join(f"{k} {figures(runs[k][-1], args.prefill_lens).get('prefill_' + str(args.prefill_lens[0])):.1f}"
                             for k in names)
            print(f"round {r + 1}/{args.repeats}: prefill {args.prefill_lens[0]} tok/s  {line}  "
                  f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)

    read_bw.append(read_bandwidth(args.threads, repeats=3).median)
    per = {k: [figures(x, args.prefill_lens) for x in v] for k, v in runs.items()}
    loads = [x["load"] for v in runs.values() for x in v]
    metrics = list(per["ds4"][0])
    results, rows = [], []
    for m in metrics:
        unit = UNITS.get(m, "tok/s")
        row: dict = {"figure": f"{m} ({unit})", "_names": {}}
        for k in names:
            res = measure(f"{m}/{k}", unit, [f[m] for f in per[k]], load_avg_1m=[x["load"] for x in runs[k]])
            results.append(res)
            row[k] = res.median
            row["_names"][k] = res.name
        for k in names[1:]:
            ratio = measure(f"{m}/ds4_over_{k}", "x", [a[m] / b[m] for a, b in zip(per["ds4"], per[k])])
            results.append(ratio)
            row[f"ds4/{k}"] = ratio.median
            row["_names"][f"ds4/{k}"] = ratio.name
        rows.append(row)
    machine = machine_info(
        threads=args.threads, rounds=args.repeats, ctx=args.ctx, prefill=args.prefill_lens, decode_steps=args.decode,
        warmup=args.warmup, model=str(model), llama_model=str(lmodel), llama_cpp_python=LLAMA_CPP_PYTHON_VERSION,
        llama_cpp_commit=build.commit, load_avg_1m={"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        llama_n_ubatch=runs[names[-1]][0].get("n_ubatch"), ds4_prefill_chunk=runs["ds4"][0].get("prefill_chunk"),
        agreement=agree, read_bandwidth_GB_s=read_bw, decode_weight_bytes=runs["ds4"][0]["decode_weight_bytes"],
        page_cache=args.page_cache, page_cache_before=cache_states,
        file_huge_bytes={k: [x.get("file_huge_bytes", 0) for x in v] for k, v in runs.items()})
    print(f"ds4 vs llama.cpp {LLAMA_CPP_PYTHON_VERSION} ({build.commit[:10]}): {model.name}, {args.threads} threads, "
          f"ctx {args.ctx}, {args.repeats} rounds; 1-min load avg {min(loads):.1f}-{max(loads):.1f} "
          f"on {os.cpu_count()} logical CPUs")
    report(results, machine, args, ["figure", *names, *[f"ds4/{k}" for k in names[1:]]], rows)
    for k, v in agree.items():
        print(f"ds4 vs {k} (round 1): {v}")
    for k, v in runs.items():
        huge = [x.get("file_huge_bytes", 0) / 1e6 for x in v]
        print(f"{k}: file pages mapped with 2 MiB entries at the end of each run: "
              f"{', '.join(f'{h:.0f}' for h in huge)} MB (page cache: {args.page_cache})")
    if "decode" in per["ds4"][0]:
        wbytes = runs["ds4"][0]["decode_weight_bytes"]
        gbs = statistics.median(f["decode"] for f in per["ds4"]) * wbytes / 1e9
        print(f"ds4 decode streams {gbs:.2f} GB/s of weights ({wbytes / 1e6:.0f} MB per step) = "
              f"{100 * gbs / max(read_bw):.0f}% of the read bandwidth ({args.threads} threads: "
              f"{read_bw[0]:.1f} GB/s before, {read_bw[1]:.1f} after the rounds)")


if __name__ == "__main__":
    raise SystemExit(main())
