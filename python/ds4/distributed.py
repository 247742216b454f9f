"""Pipeline-parallel inference across machines, on Ray (``pip install 'ds4[distributed]'``).

:class:`PipelineEngine` splits a model's layers into stages (:mod:`ds4.stages`) and runs each on
its own Ray actor, placed through a placement group so that every stage can sit on its own node.
The driver keeps the timeline and offers the ordinary :class:`~ds4.session.Session` API (sync,
eval, logits, rewind, snapshots, DSV4 payloads, the disk KV cache) and ``generate``::

    import ray, ds4.distributed
    ray.init(address="auto")                       # or let PipelineEngine start a local instance
    eng = ds4.distributed.PipelineEngine("DeepSeek-V4-Flash-Q2.gguf", stages=2)
    s = eng.session(ctx=32768)
    s.sync(eng.tokenizer.encode("Hello"))
    s.eval(s.argmax())

What crosses a stage boundary is the HC state (``n_hc * n_embd`` float32 per token) and the token
ids, as Ray object refs handed from actor to actor (never files). Prefill chunks are all submitted
at once, so stage k works on chunk i+1 while stage k+1 works on chunk i; decode is one chained call
per token. A stage that dies, or does not answer within ``timeout`` seconds, raises
:class:`~ds4.errors.PipelineError` naming it; a new PipelineEngine resumes the conversation from a
saved payload (``load_session``) or the disk KV cache.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from .errors import Ds4Error, PipelineError
from .stages import PipelineBase, StageHost

__all__ = ["PipelineEngine"]

DEFAULT_TIMEOUT = 600.0   # seconds one stage call may take (a 4096-token chunk of Pro on a slow node)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise PipelineError("ds4.distributed runs its stages on Ray, which is not installed: "
                            "pip install 'ds4[distributed]'") from None
    return ray


class RayStageHost(StageHost):
    """The stage host as a Ray actor: also says which Ray node it runs on."""

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "node": _ray().get_runtime_context().get_node_id()}


class RayLink:
    """One stage session behind a Ray actor: calls return object refs, ``fetch`` waits for them
    with a deadline and turns Ray's failures into ds4 errors."""

    def __init__(self, engine: "PipelineEngine", stage: int, sid: int) -> None:
        self.engine, self.stage, self.sid = engine, stage, sid
        self.actor = engine._actors[stage]

    def submit_forward(self, tokens: np.ndarray, pos0: int, hc_in: Any, prefill: bool) -> Any:
        return self.actor.forward.remote(self.sid, tokens, pos0, hc_in, prefill)

    def submit(self, method: str, *args: Any) -> Any:
        return self.actor.call.remote(self.sid, method, *args)

    def fetch(self, handles: list[Any]) -> list[Any]:
        return self.engine._get(handles)

    def close(self) -> None:
        if not self.engine._closed:
            try:
                self.actor.close.remote(self.sid)
            except Exception:   # the actor may be gone; nothing to free then
                pass


class PipelineEngine(PipelineBase):
    """A model split into ``stages`` (a count, or explicit ``[(l0, l1), ...]``), one Ray actor each.

    ``address``: a Ray cluster to join (``ray.init(address=...)``); None uses the Ray instance this
    process already started, or starts a local one. ``threads``: threads per stage (default: the
    physical cores of the stage's node). ``cpus_per_stage``: CPUs each stage reserves (default:
    one, or an even share of a smaller cluster); ``resources``: extra Ray resources per stage (one
    dict per stage, e.g. ``{"node:10.0.0.2": 0.01}`` to pin a stage to a node). Stages are placed
    with a ``SPREAD`` placement group: on different nodes when the cluster has enough. ``timeout``
    bounds every stage call and the placement (:class:`~ds4.errors.PipelineError` after it).
    """

    def __init__(self, path: str | os.PathLike[str], stages: int | Sequence[Sequence[int]] = 2,
                 address: str | None = None, threads: int | None = None, prefill_chunk: int | None = None,
                 mtp_path: str | os.PathLike[str] | None = None, cpus_per_stage: float | None = None,
                 resources: Sequence[dict[str, float]] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 placement_timeout: float = 120.0) -> None:
        ray = _ray()
        self._closed = True
        self._init_common(path, stages, prefill_chunk, mtp_path)
        self.timeout = float(timeout)
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        n = self.n_stages
        if cpus_per_stage is None:
            total = float(ray.cluster_resources().get("CPU", 1.0))
            cpus_per_stage = min(1.0, total / n)
        extra = list(resources) if resources is not None else [{} for _ in range(n)]
        if len(extra) != n:
            raise PipelineError(f"resources has {len(extra)} entries for {n} stages")
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        bundles = [{"CPU": float(cpus_per_stage), **{k: float(v) for k, v in r.items()}} for r in extra]
        self._pg = placement_group(bundles, strategy="SPREAD")
        try:
            ray.get(self._pg.ready(), timeout=placement_timeout)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self._pg)
            raise PipelineError(f"Ray could not place {n} stages with {bundles[0]} each within {placement_timeout:.0f} s "
                                f"(cluster has {ray.cluster_resources()})") from None
        host = ray.remote(RayStageHost)
        self._actors = [
            host.options(num_cpus=float(cpus_per_stage), max_restarts=0, max_task_retries=0,
                         scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=k))
            .remote(self.path, r, threads=threads, prefill_chunk=prefill_chunk, mtp_path=mtp_path)
            for k, r in enumerate(self.ranges)
        ]
        self._closed = False
        try:
            self.stage_info = self._get([a.describe.remote() for a in self._actors], load=True)
        except BaseException:
            self.close()
            raise
        self.threads = int(self.stage_info[0]["threads"])

    def _links(self, sid: int, ctx: int) -> list[RayLink]:
        if self._closed:
            raise PipelineError("this PipelineEngine is closed")
        self._get([a.open.remote(sid, ctx) for a in self._actors])
        return [RayLink(self, k, sid) for k in range(self.n_stages)]

    def _get(self, refs: list[Any], load: bool = False) -> list[Any]:
        """ray.get with the deadline; a stage failure becomes PipelineError naming the stage, an
        error the stage raised on purpose (a Ds4Error: bad payload, full context...) passes through."""
        ray = _ray()
        timeout = self.timeout if not load else max(self.timeout, 600.0)
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, Ds4Error):
                raise cause from None
            if isinstance(cause, ray.exceptions.RayActorError):
                raise self._stage_failure(cause) from None
            raise PipelineError(f"a pipeline stage failed: {e}") from None
        except ray.exceptions.GetTimeoutError:
            raise PipelineError(f"a pipeline stage did not answer within {timeout:.0f} s "
                                f"({self._health()}); resume on a new pipeline from a saved payload") from None
        except ray.exceptions.RayActorError as e:
            raise self._stage_failure(e) from None

    def _stage_failure(self, err: Exception) -> PipelineError:
        return PipelineError(f"pipeline stage lost ({self._health()}): {type(err).__name__}; start a new "
                             "PipelineEngine and resume from a saved payload or the disk KV cache")

    def _health(self, probe_timeout: float = 10.0) -> str:
        """Which stages still answer, for the error message: one probe to each, waited for together
        at most probe_timeout seconds. A live stage answers after the calls queued before it."""
        ray = _ray()
        probes = [a.describe.remote() for a in self._actors]
        ready, _ = ray.wait(probes, num_returns=len(probes), timeout=probe_timeout)
        states = []
        for k, (p, r) in enumerate(zip(probes, self.ranges)):
            name = f"stage {k} layers [{r[0]}, {r[1]})"
            if p not in ready:
                states.append(f"{name} not answering (busy or hung)")
                continue
            try:
                ray.get(p)
                states.append(f"{name} alive")
            except Exception as e:
                states.append(f"{name} DOWN ({type(e).__name__})")
        return "; ".join(states)

    def close(self) -> None:
        """Stop the stage actors and free their placement (sessions of this engine stop working)."""
        if self._closed:
            return
        self._closed = True
        ray = _ray()
        from ray.util.placement_group import remove_placement_group
        for a in self._actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        try:
            remove_placement_group(self._pg)
        except Exception:
            pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:   # interpreter shutdown: Ray may already be gone
            pass

    def __enter__(self) -> "PipelineEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PipelineEngine({str(self.path)!r}, stages={self.ranges})"
