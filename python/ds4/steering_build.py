"""Building steering directions from two prompt sets (upstream's dir-steering extractor method).

Each prompt is rendered as one chat turn (system text, user text, assistant prefix; thinking off
unless asked) and evaluated; the chosen component (``ffn_out`` or ``attn_out``) of every layer is
read from the session's activation tap at the prompt's last token. Per layer the direction is the
difference of the target ("good") and contrast ("bad") means, normalised; by default it is then
made orthogonal to the contrast mean and normalised again, so removing it leaves the average
contrast activation alone. Prompts are used in pairs (the shorter file sets the count), as
upstream does. A positive runtime scale suppresses the direction, a negative one amplifies it.

    >>> import numpy as np
    >>> good = np.array([[[1.0, 1.0, 0.0]]]); bad = np.array([[[0.0, 1.0, 0.0]]])
    >>> directions_from_captures(good, bad, orthogonalize=True).round(3).tolist()
    [[1.0, 0.0, 0.0]]
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from .errors import ContextOverflowError, Ds4IOError, InvalidArgumentError
from .steering import COMPONENTS, FORMAT, Steering

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine

__all__ = ["read_prompt_file", "capture_prompts", "directions_from_captures", "build_steering", "BuildResult",
           "DEFAULT_SYSTEM"]

DEFAULT_SYSTEM = "You are a helpful assistant."   # upstream's extractor default (with the period)


def read_prompt_file(path: str | os.PathLike[str]) -> list[str]:
    """One prompt per non-empty line; lines starting with ``#`` are comments."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise Ds4IOError(f"{p}: cannot read prompt file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"{p}: prompt file is not UTF-8 ({e.reason} at byte {e.start})") from None
    prompts = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    if not prompts:
        raise InvalidArgumentError(f"{p}: no prompts found (one per line, '#' starts a comment)")
    return prompts


def capture_prompts(engine: "Engine", prompts: Sequence[str], component: str, *, system: str | None = DEFAULT_SYSTEM,
                    think: bool = False, ctx: int = 512,
                    progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """``component`` at each prompt's last token, float32 ``[len(prompts), n_layer, n_embd]``.

    Each prompt runs in a fresh timeline of one session with the engine's steering (none when
    building a direction from the plain model).
    """
    from .chat import encode_chat_prompt

    if component not in COMPONENTS:
        raise InvalidArgumentError(f"unknown component {component!r}; expected one of {', '.join(COMPONENTS)}")
    tok = engine.tokenizer
    s = engine.session(ctx=ctx)
    out = np.empty((len(prompts), engine.shape.n_layer, engine.shape.n_embd), np.float32)
    for i, text in enumerate(prompts):
        ids = encode_chat_prompt(tok, text, system=system or None, think="high" if think else "none", ctx=ctx)
        if len(ids) >= ctx:
            raise ContextOverflowError(f"prompt {i + 1} has {len(ids)} tokens; raise --ctx above {len(ids)}")
        s.reset()
        with s.capture(component, last_only=True) as cap:
            s.sync(ids)
        out[i] = cap[component][-1]
        if progress is not None:
            progress(i + 1, len(prompts))
    return out


def _unit(v: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; all-zero rows stay zero (upstream leaves them as they are)."""
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return np.where(n > 0, v / np.where(n > 0, n, 1), v)


def directions_from_captures(good: np.ndarray, bad: np.ndarray, *, orthogonalize: bool = True,
                             pair_normalize: bool = False) -> np.ndarray:
    """Per-layer unit directions ``[n_layer, n_embd]`` from paired captures ``[pairs, n_layer, n_embd]``.

    ``pair_normalize`` averages the normalised per-pair differences instead of differencing the
    means; ``orthogonalize`` removes the part parallel to the contrast mean (then renormalises).
    Computed in float64.
    """
    good = np.asarray(good, np.float64)
    bad = np.asarray(bad, np.float64)
    if good.shape != bad.shape or good.ndim != 3:
        raise InvalidArgumentError(f"captures must be two equal [pairs, n_layer, n_embd] arrays, got "
                                   f"{good.shape} and {bad.shape}")
    if pair_normalize:
        d = _unit(_unit(good - bad).mean(axis=0))
    else:
        d = _unit(good.mean(axis=0) - bad.mean(axis=0))
    if orthogonalize:
        base = _unit(bad.mean(axis=0))
        d = _unit(d - (d * base).sum(axis=-1, keepdims=True) * base)
    return d.astype(np.float32)


@dataclass
class BuildResult:
    steering: Steering
    metadata: dict = field(default_factory=dict)
    pairs: int = 0


def build_steering(engine: "Engine", good: Sequence[str], bad: Sequence[str], component: str = "ffn_out", *,
                   system: str | None = DEFAULT_SYSTEM, think: bool = False, ctx: int = 512,
                   orthogonalize: bool = True, pair_normalize: bool = False,
                   progress: Callable[[int, int], None] | None = None) -> BuildResult:
    """Direction file contents (FFN scale 1 by default, as a loaded file gets) and its metadata."""
    n = min(len(good), len(bad))
    if n == 0:
        raise InvalidArgumentError("both prompt sets need at least one prompt")
    total = 2 * n
    step = (lambda done, _t, off: progress(off + done, total)) if progress is not None else None
    g = capture_prompts(engine, good[:n], component, system=system, think=think, ctx=ctx,
                        progress=(lambda d, t: step(d, t, 0)) if step else None)
    b = capture_prompts(engine, bad[:n], component, system=system, think=think, ctx=ctx,
                        progress=(lambda d, t: step(d, t, n)) if step else None)
    dirs = directions_from_captures(g, b, orthogonalize=orthogonalize, pair_normalize=pair_normalize)
    meta = {
        "format": FORMAT,
        "shape": list(dirs.shape),
        "component": component,
        "thinking": bool(think),
        "pair_normalize": bool(pair_normalize),
        "orthogonalize_control_mean": bool(orthogonalize),
        "pairs": n,
        "system": system or "",
        "model": str(engine.path),
        "note": "runtime positive scale suppresses this direction; negative scale amplifies it",
    }
    return BuildResult(Steering(dirs, ffn=1.0), meta, n)
