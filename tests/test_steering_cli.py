"""``ds4 steering build`` / ``info`` and the ``--dir-steering-*`` flags, end to end on the bundled
tiny model. The build test is the issue's acceptance check: a direction built from two prompt sets,
applied with scale 1, leaves no projection on it in the captured activations."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ds4
import ds4.testing
from ds4.chat import encode_chat_prompt
from ds4.cli import main
from ds4.steering import Steering
from ds4.steering_build import DEFAULT_SYSTEM, directions_from_captures

GOOD = ["Answer in one word: the capital of France?", "Be terse. What is DNS?", "Yes or no: is water wet?",
        "# a comment line", "", "Shortest answer: 2+2?"]
BAD = ["Explain at great length, with history and many examples, what a capital city is.",
       "Write a detailed essay on the design of DNS.", "Describe in depth every property of water.",
       "Give a long, step-by-step derivation of 2+2 from the Peano axioms."]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("steer")
    (d / "good.txt").write_text("\n".join(GOOD) + "\n", encoding="utf-8")
    (d / "bad.txt").write_text("\n".join(BAD) + "\n", encoding="utf-8")
    rc = main(["steering", "build", "--good", str(d / "good.txt"), "--bad", str(d / "bad.txt"),
               "--component", "ffn_out", "--out", str(d / "out" / "terse"), "-t", "1"])
    assert rc == 0
    return d


@pytest.fixture(scope="module")
def engine():
    return ds4.Engine(ds4.testing.default_model_path(), threads=2)


def _last_rows(engine, prompts, steering=None) -> np.ndarray:
    s = engine.session(ctx=256)
    s.steering = steering
    rows = []
    for text in prompts:
        s.reset()
        with s.capture("ffn_out", last_only=True) as cap:
            s.sync(encode_chat_prompt(engine.tokenizer, text, system=DEFAULT_SYSTEM, think="none"))
        rows.append(cap["ffn_out"][-1])
    return np.array(rows, np.float64)


def test_build_writes_f32_and_metadata(built, engine) -> None:
    f32, meta = built / "out" / "terse.f32", built / "out" / "terse.json"
    info = json.loads(meta.read_text())
    assert info["format"] == "ds4-directional-steering-v1" and info["component"] == "ffn_out"
    assert info["shape"] == [engine.shape.n_layer, engine.shape.n_embd] and info["pairs"] == 4
    d = np.fromfile(f32, "<f4").reshape(info["shape"])
    np.testing.assert_allclose(np.linalg.norm(d, axis=1), 1.0, atol=1e-6)
    # The file is the mean difference of the tap's last-token rows, recomputed here independently.
    good, bad = _last_rows(engine, [g for g in GOOD if g and not g.startswith("#")]), _last_rows(engine, BAD)
    np.testing.assert_allclose(d, directions_from_captures(good, bad), atol=1e-6)


def test_built_direction_is_removed_with_positive_scale(built, engine) -> None:
    st = Steering.from_file(built / "out" / "terse.f32")
    d = st.directions.astype(np.float64)
    prompts = [g for g in GOOD if g and not g.startswith("#")]

    def rel_projection(steering) -> np.ndarray:
        y = _last_rows(engine, prompts, steering)
        return np.abs(np.einsum("ple,le->pl", y, d)) / np.linalg.norm(y, axis=2)

    plain = rel_projection(None)
    assert plain.max() > 0.05            # the target prompts do carry the direction
    assert rel_projection(st).max() < 1e-5   # scale 1 (the file default): gone, up to float rounding
    # Amplifying (negative scale) makes it larger instead, which the same measure sees.
    assert rel_projection(st.with_scales(ffn=-1.0)).mean() > plain.mean()


def test_info(built, capsys) -> None:
    assert main(["steering", "info", str(built / "out" / "terse.f32")]) == 0
    out = capsys.readouterr().out
    assert "shape [4, 256]" in out and "min 1.000000" in out and '"component": "ffn_out"' in out


def test_generate_flags(built, capsys) -> None:
    f32 = str(built / "out" / "terse.f32")
    base = ["generate", "-p", "Hello", "-n", "6", "--temp", "0", "--nothink", "-c", "128", "-t", "1"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    assert main(base + ["--dir-steering-file", f32, "--dir-steering-ffn", "0"]) == 0
    assert capsys.readouterr().out == plain          # scale 0: the plain model
    assert main(base + ["--reference", "--dir-steering-file", f32, "--dir-steering-ffn", "0"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("extra, message", [
    (["--dir-steering-ffn", "1"], "needs --dir-steering-file"),
    (["--dir-steering-file", "nope.f32"], "nope.f32: cannot read steering file"),
    (["--dir-steering-file", "{f32}", "--kv-cache-dir", "{dir}"], "cannot be combined with --kv-cache-dir"),
    (["--dir-steering-file", "{bad}"], "expected 4 layers x 256 floats = 4096 bytes"),
])
def test_flag_errors(built, capsys, extra, message) -> None:
    bad = built / "bad.f32"
    bad.write_bytes(b"\0" * 12)
    fmt = {"f32": str(built / "out" / "terse.f32"), "dir": str(built / "kv"), "bad": str(bad)}
    args = ["generate", "-p", "Hi", "-n", "1", "-c", "64"] + [a.format(**fmt) for a in extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_scale_out_of_range_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["chat", "--dir-steering-attn", "-100.5"])
    assert e.value.code == 2
    assert "[-100, 100]" in capsys.readouterr().err


def test_serve_accepts_the_flags() -> None:
    from ds4.cli import build_parser
    from ds4.steering import from_args

    args = build_parser().parse_args(["serve", "--dir-steering-file", "x.f32", "--dir-steering-attn", "0.5"])
    assert (args.dir_steering_file, args.dir_steering_ffn, args.dir_steering_attn) == ("x.f32", None, 0.5)
    with pytest.raises(ds4.errors.Ds4IOError, match="x.f32"):
        from_args(args)
