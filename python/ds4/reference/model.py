"""The reference model: GGUF in, logits out, one token at a time (docs/model.md §3.0, §5.1, §7).

    >>> m = ReferenceModel("tiny.gguf")          # doctest: +SKIP
    >>> st = m.new_state(ctx=512)                # doctest: +SKIP
    >>> logits = m.prefill(st, [1, 2, 3])        # doctest: +SKIP
    >>> logits = m.decode(st, int(logits.argmax()))  # doctest: +SKIP

Prefill runs exactly the per-token decode math for each prompt token in order (upstream's CPU
prefill computes the same math, docs/model.md §5.1), then applies the after-prefill frontier reset
(docs/runtime.md §5.1). Chunking a prefill therefore cannot change logits or state.

Tracing: pass a dict as ``trace`` and every processed token appends its intermediate values to
``trace[key]`` (a list, one entry per token, in order). Keys: ``embd``; per layer ``blk.N.<name>``
with names ``hc_attn`` / ``hc_ffn`` (:class:`~ds4.reference.hc.HcSplit`), ``attn_in``,
``attn_norm``, ``q``, ``qr_norm``, ``kv``, ``comp_row``, ``index_row``, ``comp_pooled``,
``allowed``, ``indexer_scores``, ``indexer_selected``, ``heads``, ``attn_out``, ``after_attn``,
``ffn_in``, ``ffn_norm``, ``router_probs``, ``experts``, ``expert_weights``, ``expert_mid``,
``moe_out``, ``shared_out``, ``ffn_out``, ``out``; then ``head_collapse``, ``head_norm``,
``logits`` (the head entries only for tokens whose logits are computed). ``attn_out`` and
``ffn_out`` are the vectors HC post consumes, i.e. after directional steering when
``ReferenceModel.steering`` is set (:mod:`ds4.steering`; the MTP block is never steered). ``q`` and ``kv`` are
after RoPE (``kv`` also after the FP8 round trip, before the cache's F16 round trip); ``heads``
after the inverse RoPE; ``comp_row`` / ``index_row`` are None on tokens that close no window;
``allowed`` is None while every compressed row is visible. The MTP block records ``mtp.<name>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import ContextOverflowError, InvalidArgumentError, ModelFormatError, UnsupportedModelError
from ..shape import ModelShape
from .attention import AttentionWeights, attention_core
from .hc import HcSplit, hc_post, hc_pre
from .head import HeadWeights, output_logits
from .moe import FfnWeights, ffn_core
from .numerics import rms_norm
from .rope import RopeParams, rope_params
from .state import LayerState, ReferenceState
from .weights import Tensor, TensorFile, read_swiglu_clamps

__all__ = ["LayerWeights", "LayerSteering", "layer_forward", "steer", "ReferenceModel"]


@dataclass
class LayerWeights:
    """All tensors of one decoder layer: two HC mixers, attention and FFN."""

    hc_attn_fn: Tensor
    hc_attn_scale: Tensor
    hc_attn_base: Tensor
    attn: AttentionWeights
    hc_ffn_fn: Tensor
    hc_ffn_scale: Tensor
    hc_ffn_base: Tensor
    ffn: FfnWeights

    @classmethod
    def load(cls, tf: TensorFile, prefix: str, ratio: int, il: int | None) -> "LayerWeights":
        g = lambda n: tf.get(f"{prefix}.{n}.weight")  # noqa: E731
        return cls(g("hc_attn_fn"), g("hc_attn_scale"), g("hc_attn_base"),
                   AttentionWeights.load(tf, prefix, ratio, il),
                   g("hc_ffn_fn"), g("hc_ffn_scale"), g("hc_ffn_base"), FfnWeights.load(tf, prefix))


def _hc_pre(streams: np.ndarray, fn: Tensor, scale: Tensor, base: Tensor, s: ModelShape
            ) -> tuple[np.ndarray, HcSplit]:
    return hc_pre(streams, fn.values, scale.values, base.values, s.sinkhorn_iters, s.rms_eps, s.hc_eps)


def steer(y: np.ndarray, direction: np.ndarray, scale: float) -> np.ndarray:
    """Directional steering of one layer output: ``y - scale * (d . y) * d`` (docs/model.md §3.9 step 4)."""
    if scale == 0.0:
        return y
    coeff = np.float32(scale * float(np.dot(y.astype(np.float64), direction.astype(np.float64))))
    return (y - coeff * direction).astype(np.float32)


@dataclass(frozen=True)
class LayerSteering:
    """One layer's steering direction and the attention-output / FFN-output scales."""

    direction: np.ndarray
    attn: float
    ffn: float


def layer_forward(w: LayerWeights, ls: LayerState, streams: np.ndarray, pos: int, token: int,
                  s: ModelShape, rope: RopeParams, clamp: float, trace: dict | None = None,
                  steering: LayerSteering | None = None) -> np.ndarray:
    """One decoder layer for one token: HC pre, attention, HC post, HC pre, FFN, HC post."""
    x, split = _hc_pre(streams, w.hc_attn_fn, w.hc_attn_scale, w.hc_attn_base, s)
    a = rms_norm(x, w.attn.norm.values, s.rms_eps)
    attn_out = attention_core(w.attn, a, ls, pos, s, rope, trace)
    if steering is not None:
        attn_out = steer(attn_out, steering.direction, steering.attn)
    after_attn = hc_post(attn_out, streams, split)

    x2, split2 = _hc_pre(after_attn, w.hc_ffn_fn, w.hc_ffn_scale, w.hc_ffn_base, s)
    n = rms_norm(x2, w.ffn.norm.values, s.rms_eps)
    f = ffn_core(w.ffn, n, token, s, clamp, trace)
    if steering is not None:
        f = steer(f, steering.direction, steering.ffn)
    out = hc_post(f, after_attn, split2)
    if trace is not None:
        trace.update(hc_attn=split, attn_in=x, attn_norm=a, attn_out=attn_out, after_attn=after_attn,
                     hc_ffn=split2, ffn_in=x2, ffn_norm=n, ffn_out=f, out=out)
    return out


def _record(trace: dict | None, prefix: str, values: dict) -> None:
    if trace is None:
        return
    for k, v in values.items():
        trace.setdefault(f"{prefix}{k}", []).append(v)


class ReferenceModel:
    """A DS4 GGUF model evaluated in numpy (small models only: weights are dequantised in memory).

    ``mtp_path`` names a separate GGUF holding the ``mtp.0.*`` block; without it the block is
    taken from the main file when present there. ``steering`` (a :class:`ds4.steering.Steering`,
    settable later as the ``steering`` attribute) edits every layer's attention/FFN output.
    """

    def __init__(self, path: str | Path, mtp_path: str | Path | None = None, steering=None) -> None:
        from ..inspection import inspect  # validates metadata and tensor layout, header only

        info = inspect(path)
        if info.shape is None:
            raise UnsupportedModelError(f"{path}: architecture {info.arch!r} is not DeepSeek V4")
        self.file = TensorFile(path)
        self.shape: ModelShape = info.shape
        s = self.shape
        self.clamps = read_swiglu_clamps(self.file, s)
        self.token_embd = self.file.get("token_embd.weight", (s.n_embd, s.n_vocab))
        self.layers = [LayerWeights.load(self.file, f"blk.{il}", s.compress_ratio(il), il)
                       for il in range(s.n_layer)]
        self.ropes = [rope_params(s, s.compress_ratio(il)) for il in range(s.n_layer)]
        self.head = HeadWeights.load(self.file)
        self._check_layout()
        from .mtp import MtpWeights  # local: mtp builds on this module's layer code

        mtp_file = TensorFile(mtp_path) if mtp_path is not None else self.file
        self.mtp = MtpWeights.load(mtp_file) if mtp_file.has("mtp.0.e_proj.weight") else None
        if mtp_path is not None and self.mtp is None:
            raise ModelFormatError(f"{mtp_path}: no mtp.0.* tensors found")
        self.steering = steering

    @property
    def steering(self):
        """The :class:`ds4.steering.Steering` applied to every layer (None: off)."""
        return self._steering

    @steering.setter
    def steering(self, value) -> None:
        self._steering = value.for_shape(self.shape) if value is not None else None

    def _layer_steering(self, il: int) -> LayerSteering | None:
        st = self._steering
        if st is None or not st.active:
            return None
        return LayerSteering(st.directions[il], st.attn, st.ffn)

    def _check_layout(self) -> None:
        """Fail early, naming the tensor, on the size mismatches that would break the math."""
        s = self.shape
        if s.head_dim == s.indexer_head_dim and any(r == 4 for r in s.compress_ratios):
            raise ModelFormatError("attention head_dim must differ from the indexer head dim "
                                   f"({s.indexer_head_dim}): the compressor picks FP8 vs FP4 by width")
        for il, lw in enumerate(self.layers):
            a = lw.attn
            for t, dims in ((a.q_a, (s.n_embd, s.q_lora_rank)), (a.q_b, (s.q_lora_rank, s.q_dim)),
                            (a.kv, (s.n_embd, s.head_dim)), (a.out_a, (s.group_dim, s.out_low_dim)),
                            (a.out_b, (s.out_low_dim, s.n_embd)), (a.sinks, (s.n_head,)),
                            (lw.ffn.gate_exps, (s.n_embd, s.n_ff_exp, s.n_expert)),
                            (lw.ffn.down_exps, (s.n_ff_exp, s.n_embd, s.n_expert))):
                if tuple(t.dims) != dims:
                    raise ModelFormatError(f"{self.file.path}: tensor {t.name} has dims {list(t.dims)}, "
                                           f"expected {list(dims)}")

    # ---- sessions ----
    def new_state(self, ctx: int) -> ReferenceState:
        """A fresh state able to hold ``ctx`` tokens."""
        return ReferenceState(self.shape, int(ctx))

    def embed(self, token: int) -> np.ndarray:
        if not 0 <= token < self.shape.n_vocab:
            raise InvalidArgumentError(f"token id {token} outside the vocabulary (0..{self.shape.n_vocab - 1})")
        return self.token_embd.values[token]

    def _forward(self, st: ReferenceState, token: int, want_logits: bool, trace: dict | None) -> np.ndarray | None:
        s = self.shape
        pos = st.pos
        if pos >= st.ctx:
            raise ContextOverflowError(f"position {pos} is outside the context of {st.ctx} tokens")
        e = self.embed(token)
        streams = np.repeat(e[None, :], s.n_hc, axis=0).astype(np.float32)
        _record(trace, "", {"embd": e})
        for il, lw in enumerate(self.layers):
            lt = {} if trace is not None else None
            streams = layer_forward(lw, st.layers[il], streams, pos, token, s, self.ropes[il],
                                    self.clamps[il], lt, self._layer_steering(il))
            _record(trace, f"blk.{il}.", lt or {})
        st.tokens.append(int(token))
        st.hidden = streams
        if not want_logits:
            return None
        ht = {} if trace is not None else None
        logits = output_logits(self.head, streams, s, ht)
        if ht is not None:
            ht["logits"] = logits
        _record(trace, "", ht or {})
        st.logits = logits
        return logits

    def decode(self, st: ReferenceState, token: int, trace: dict | None = None) -> np.ndarray:
        """Evaluate one token at ``st.pos``; returns the next-token logits (float32[n_vocab])."""
        return self._forward(st, int(token), True, trace)

    def prefill(self, st: ReferenceState, tokens: Sequence[int], trace: dict | None = None,
                finish: bool = True) -> np.ndarray:
        """Evaluate ``tokens`` in order from ``st.pos``; returns the last token's logits.

        Same per-token math as :meth:`decode`; then, unless ``finish`` is false, the after-prefill
        frontier reset (numerically a no-op; it makes the state byte-equal to upstream's after a
        prefill). :meth:`decode` never resets.
        """
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise InvalidArgumentError("prefill needs at least one token")
        if st.pos + len(tokens) > st.ctx:
            raise ContextOverflowError(f"{st.pos} + {len(tokens)} tokens exceed the context of {st.ctx}")
        for i, t in enumerate(tokens):
            logits = self._forward(st, t, i == len(tokens) - 1, trace)
        if finish:
            st.finish_prefill()
        return logits

    # ---- MTP ----
    def mtp_step(self, st: ReferenceState, hidden: np.ndarray, token: int, pos: int,
                 trace: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One MTP draft step (docs/model.md §3.12): returns ``(logits, hc_out)``."""
        if self.mtp is None:
            raise InvalidArgumentError("this model has no MTP block (mtp.0.* tensors)")
        from .mtp import mtp_step

        return mtp_step(self, st, hidden, token, pos, trace)

    def mtp_logits(self, st: ReferenceState, hidden: np.ndarray, token: int, pos: int,
                   trace: dict | None = None) -> np.ndarray:
        """Logits of one MTP step; chain with :meth:`mtp_step` to get the HC state as well."""
        return self.mtp_step(st, hidden, token, pos, trace)[0]
