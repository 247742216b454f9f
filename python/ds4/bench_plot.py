"""PNG plot of ``ds4 bench`` runs: prefill and decode tokens/s against context length.

Needs matplotlib (``pip install 'ds4[plot]'``); it is imported only here, so the rest of ds4 never
depends on it. Two panels share the context axis (prefill and decode speeds differ by an order of
magnitude, so each gets its own y scale); each run is one line per panel.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ._atomic import temp_path
from .errors import Ds4IOError, InvalidArgumentError
from .frontier_bench import BenchRun

__all__ = ["plot_runs"]


def plot_runs(runs: Sequence[BenchRun], path: str | os.PathLike[str], title: str | None = None) -> Path:
    """Write the plot of ``runs`` to ``path`` (PNG, atomically); returns the path."""
    try:
        import matplotlib
        matplotlib.use("Agg")   # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidArgumentError("plotting needs matplotlib: pip install 'ds4[plot]'") from None
    fig, (ax_p, ax_g) = plt.subplots(2, 1, sharex=True, figsize=(8, 6.5))
    try:
        for run in runs:
            x = [r.ctx_tokens for r in run.rows]
            ax_p.plot(x, [r.prefill_tps for r in run.rows], marker="o", ms=3, label=run.label or None)
            ax_g.plot(x, [r.gen_tps for r in run.rows], marker="o", ms=3, label=run.label or None)
        ax_p.set_ylabel("prefill tokens/s")
        ax_g.set_ylabel("decode tokens/s")
        ax_g.set_xlabel("context tokens (frontier)")
        for ax in (ax_p, ax_g):
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
        if len(runs) > 1 or any(r.label for r in runs):
            ax_p.legend()
        fig.suptitle(title or "ds4 bench: throughput at each context frontier")
        fig.tight_layout()
        out = Path(path)
        tmp = temp_path(out)
        try:
            fig.savefig(tmp, format="png", dpi=110)
            os.replace(tmp, out)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise Ds4IOError(f"{out}: cannot write plot: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return out
