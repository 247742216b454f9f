// ds4._core.OpHarness (internal, for tests/backend_ops): runs one backend op on numpy inputs.
// Inputs are uploaded into fresh backend tensors, weights are registered as zero-copy model maps
// (the way an engine maps the GGUF), outputs are downloaded into new arrays. A harness is bound
// to one backend and, for the CPU backend, one SIMD path (set around each call), so every SIMD
// table runs through the interface as a backend under test.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <deque>
#include <optional>

#include "backend/backend.h"
#include "common/errors.h"
#include "layers/fp_quant.h"
#include "model/rope_params.h"
#include "quant/simd.h"

namespace py = pybind11;
using namespace ds4;
using namespace ds4::backend;

namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using Rope = std::tuple<float, float, float, float, float, float, float, float>;

SimdPath simd_from_name(const std::string& name) {
    for (SimdPath p : available_simd_paths()) {
        if (name == simd_path_name(p)) return p;
    }
    fail(ErrorKind::Unsupported, "SIMD path '" + name + "' is not available here");
}

RopeParams rope_from(const Rope& r) {
    RopeParams p;
    std::tie(p.freq_base, p.freq_scale, p.ext_factor, p.attn_factor, p.corr_low, p.corr_high, p.theta_scale,
             p.mscale_ext) = r;
    return p;
}

class OpHarness {
public:
    OpHarness(const std::string& backend, const std::string& simd, int threads)
        : be_(create_backend(backend, threads)), st_(be_->new_stream()), simd_(simd) {
        if (!simd.empty()) simd_from_name(simd);
    }

    // Runs fn with this harness's SIMD path active, then frees the call's tensors.
    template <class Fn>
    auto call(Fn fn) {
        struct Restore {
            SimdPath before;
            bool active;
            ~Restore() { if (active) set_simd_path(before); }
        } restore{simd_path(), !simd_.empty()};
        if (!simd_.empty()) set_simd_path(simd_from_name(simd_));
        Cleanup cleanup{this};
        st_->begin();
        auto out = fn();
        st_->end();
        return out;
    }

    Tensor in(const F32Array& a, int64_t width = 0) {
        const int64_t n = (int64_t)a.size();
        if (width <= 0) width = a.ndim() >= 1 ? a.shape(a.ndim() - 1) : 1;
        if (width <= 0) width = 1;
        Tensor t = alloc(DType::F32, width, n / width);
        if (n) st_->upload(t, a.data(), (uint64_t)n * 4);
        return t;
    }
    Tensor in_i32(const I32Array& a, int64_t width) {
        const int64_t n = (int64_t)a.size();
        Tensor t = alloc(DType::I32, width, n / width);
        if (n) st_->upload(t, a.data(), (uint64_t)n * 4);
        return t;
    }
    Tensor alloc(DType type, int64_t width, int64_t rows) {
        owned_.emplace_back(*be_, type, std::max<int64_t>(width, 1), std::max<int64_t>(rows, 1));
        Tensor t = *owned_.back();
        t.ne = {{width, rows}};
        return t;
    }
    py::array_t<float> out(const Tensor& t) {
        py::array_t<float> a({t.rows(), t.width()});
        if (t.nbytes()) st_->download(t, a.mutable_data(), (uint64_t)t.nbytes());
        return a;
    }
    py::array_t<int32_t> out_i32(const Tensor& t) {
        py::array_t<int32_t> a({t.rows(), t.width()});
        if (t.nbytes()) st_->download(t, a.mutable_data(), (uint64_t)t.nbytes());
        return a;
    }
    py::array_t<uint8_t> out_u8(const Tensor& t) {
        py::array_t<uint8_t> a({t.width()});
        if (t.nbytes()) st_->download(t, a.mutable_data(), (uint64_t)t.nbytes());
        return a;
    }
    // A weight: raw bytes of GGML type `type` and dims (ggml order), mapped without a copy.
    const TensorRef* weight(const py::array& bytes, uint32_t type, const std::vector<int64_t>& dims) {
        if (!(bytes.flags() & py::array::c_style)) fail(ErrorKind::InvalidArgument, "weight bytes must be C-contiguous");
        TensorRef r;
        r.data = static_cast<const uint8_t*>(bytes.data());
        r.type = static_cast<GgmlType>(type);
        for (size_t i = 0; i < dims.size() && i < 3; ++i) r.ne[i] = dims[i];
        r.nbytes = (int64_t)bytes.nbytes();
        int64_t need = row_bytes(r.type, r.ne[0]) * r.ne[1] * r.ne[2];
        if (need > r.nbytes) fail(ErrorKind::InvalidArgument, "weight bytes are shorter than its dims need");
        maps_.push_back(be_->map_model(r.data, (uint64_t)r.nbytes));
        refs_.push_back(r);
        return &refs_.back();
    }
    const TensorRef* f32_weight(const std::optional<F32Array>& a) {
        if (!a) return nullptr;
        return weight(*a, (uint32_t)GgmlType::F32, {(int64_t)a->size()});
    }
    Stream& st() { return *st_; }
    const char* name() const { return be_->name(); }
    bool supports(const std::string& op, uint32_t type) const {
        for (int i = 0; i < (int)Op::kCount; ++i) {
            if (op == op_name((Op)i)) return be_->supports((Op)i, (GgmlType)type);
        }
        fail(ErrorKind::InvalidArgument, "unknown op '" + op + "'");
    }

private:
    struct Cleanup {
        OpHarness* h;
        ~Cleanup() {
            h->owned_.clear();
            h->maps_.clear();
            h->refs_.clear();
        }
    };
    std::unique_ptr<Backend> be_;
    std::unique_ptr<Stream> st_;
    std::string simd_;
    std::deque<OwnedTensor> owned_;
    std::deque<std::unique_ptr<Buffer>> maps_;
    std::deque<TensorRef> refs_;
};

using W = py::array;   // weight bytes

}  // namespace

void init_backend_ops(py::module_& m) {
    m.def("op_names", [] {
        std::vector<std::string> out;
        for (int i = 0; i < (int)Op::kCount; ++i) out.emplace_back(op_name((Op)i));
        return out;
    });
    m.def("_rope_params", [](int n_rot, float base, float comp_base, float scale, int64_t orig_ctx, float beta_fast,
                             float beta_slow, int ratio) {
        Shape s;
        s.n_rot = n_rot;
        s.rope_freq_base = base;
        s.compress_rope_freq_base = comp_base;
        s.rope_scale_factor = scale;
        s.rope_orig_ctx = orig_ctx;
        s.yarn_beta_fast = beta_fast;
        s.yarn_beta_slow = beta_slow;
        s.compress_ratios = {ratio};
        const RopeParams p = rope_params_for_layer(s, 0);
        return Rope{p.freq_base, p.freq_scale, p.ext_factor, p.attn_factor, p.corr_low, p.corr_high, p.theta_scale,
                    p.mscale_ext};
    });

    py::class_<OpHarness>(m, "OpHarness")
        .def(py::init<const std::string&, const std::string&, int>(), py::arg("backend") = "cpu",
             py::arg("simd") = "", py::arg("threads") = 1)
        .def_property_readonly("name", &OpHarness::name)
        .def("supports", &OpHarness::supports)
        .def("embed_tokens_hc", [](OpHarness& h, W table, uint32_t type, int64_t n_embd, int64_t n_vocab,
                                   std::vector<int32_t> tokens, int n_hc) {
            return h.call([&] {
                const TensorRef* t = h.weight(table, type, {n_embd, n_vocab});
                Tensor out = h.alloc(DType::F32, n_embd * n_hc, (int64_t)tokens.size());
                h.st().embed_tokens_hc({t, tokens.data(), (int64_t)tokens.size(), n_hc, out});
                return h.out(out);
            });
        })
        .def("rms_norm", [](OpHarness& h, F32Array x, std::optional<F32Array> w, float eps) {
            return h.call([&] {
                Tensor tx = h.in(x), to = h.alloc(DType::F32, tx.width(), tx.rows());
                h.st().rms_norm({tx, to, h.f32_weight(w), eps});
                return h.out(to);
            });
        })
        .def("head_rms_norm", [](OpHarness& h, F32Array x, int64_t n_head, int64_t head_dim, float eps) {
            return h.call([&] {
                Tensor tx = h.in(x);
                h.st().head_rms_norm({tx, n_head, head_dim, eps});
                return h.out(tx);
            });
        })
        .def("linear", [](OpHarness& h, W w, uint32_t type, int64_t n, int64_t rows, F32Array x) {
            return h.call([&] {
                const TensorRef* tw = h.weight(w, type, {n, rows});
                Tensor tx = h.in(x, n), ty = h.alloc(DType::F32, rows, tx.rows());
                h.st().linear({tw, tx, ty});
                return h.out(ty);
            });
        })
        // members: (weight bytes, GGML type, n, rows) each; x: rows of its last dimension's width.
        // Returns one output array per member.
        .def("linear_group", [](OpHarness& h, const std::vector<std::tuple<W, uint32_t, int64_t, int64_t>>& members,
                                F32Array x) {
            return h.call([&] {
                Tensor tx = h.in(x);
                LinearGroupArgs g(tx);
                std::vector<Tensor> ys;
                for (const auto& m : members) {
                    const TensorRef* tw = h.weight(std::get<0>(m), std::get<1>(m), {std::get<2>(m), std::get<3>(m)});
                    ys.push_back(h.alloc(DType::F32, std::get<3>(m), tx.rows()));
                    g.add(tw, ys.back());
                }
                h.st().linear_group(g);
                std::vector<py::array_t<float>> out;
                for (const Tensor& y : ys) out.push_back(h.out(y));
                return out;
            });
        })
        .def("grouped_output_a", [](OpHarness& h, W w, uint32_t type, int64_t group_dim, int64_t n_group,
                                    int64_t rank, F32Array heads) {
            return h.call([&] {
                const TensorRef* tw = h.weight(w, type, {group_dim, n_group * rank});
                Tensor th = h.in(heads, n_group * group_dim), tl = h.alloc(DType::F32, n_group * rank, th.rows());
                h.st().grouped_output_a({tw, th, tl, n_group, rank});
                return h.out(tl);
            });
        })
        .def("hc_pre", [](OpHarness& h, W fn, uint32_t type, F32Array scale, F32Array base, F32Array H, int n_hc,
                          int iters, float rms_eps, float hc_eps) {
            return h.call([&] {
                const int64_t hd = H.shape(H.ndim() - 1), E = hd / n_hc, mixn = 2 * n_hc + n_hc * n_hc;
                const TensorRef* tfn = h.weight(fn, type, {hd, mixn});
                Tensor tH = h.in(H), tx = h.alloc(DType::F32, E, tH.rows()), ts = h.alloc(DType::F32, mixn, tH.rows());
                h.st().hc_pre({tfn, h.f32_weight(scale), h.f32_weight(base), tH, tx, ts, n_hc, iters, rms_eps, hc_eps});
                return py::make_tuple(h.out(tx), h.out(ts));
            });
        })
        .def("hc_post", [](OpHarness& h, F32Array block, F32Array residual, F32Array split, int n_hc) {
            return h.call([&] {
                Tensor tb = h.in(block), tr = h.in(residual), ts = h.in(split);
                Tensor to = h.alloc(DType::F32, tr.width(), tr.rows());
                h.st().hc_post({tb, tr, ts, to, n_hc});
                return h.out(to);
            });
        })
        .def("hc_collapse_norm", [](OpHarness& h, W fn, uint32_t type, F32Array scale, F32Array base, F32Array norm,
                                    F32Array H, int n_hc, float rms_eps, float hc_eps) {
            return h.call([&] {
                const int64_t hd = (int64_t)H.size(), E = hd / n_hc;
                const TensorRef* tfn = h.weight(fn, type, {hd, n_hc});
                Tensor tH = h.in(H, hd), ty = h.alloc(DType::F32, E, 1);
                h.st().hc_collapse_norm({tfn, h.f32_weight(scale), h.f32_weight(base), h.f32_weight(norm), tH, ty, n_hc,
                                         rms_eps, hc_eps});
                return h.out(ty);
            });
        })
        .def("rope_tail", [](OpHarness& h, F32Array x, int64_t n_head, int64_t head_dim, int64_t n_rot, int64_t pos0,
                             Rope rope, bool inverse) {
            return h.call([&] {
                Tensor tx = h.in(x, n_head * head_dim);
                h.st().rope_tail({tx, n_head, head_dim, n_rot, pos0, rope_from(rope), inverse});
                return h.out(tx);
            });
        })
        .def("fp8_kv_roundtrip", [](OpHarness& h, F32Array x, int64_t n_rot) {
            return h.call([&] {
                Tensor tx = h.in(x);
                h.st().fp8_kv_roundtrip({tx, tx.width(), n_rot});
                return h.out(tx);
            });
        })
        .def("fp4_roundtrip", [](OpHarness& h, F32Array x) {
            // Not a stream op: the FP4 block round trip of indexer_qat (layers/fp_quant.h), run on
            // this harness's SIMD path, so its vector kernels can be compared with the scalar one.
            const int64_t n = (int64_t)x.size();
            if (n % 32) fail(ErrorKind::InvalidArgument, "fp4_roundtrip: length " + std::to_string(n) + " is not a multiple of 32");
            return h.call([&] {
                py::array_t<float> out(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
                std::memcpy(out.mutable_data(), x.data(), (size_t)n * sizeof(float));
                ds4::fp4_roundtrip(out.mutable_data(), n);
                return out;
            });
        })
        .def("store_row_f16", [](OpHarness& h, F32Array x) {
            return h.call([&] {
                Tensor tx = h.in(x), to = h.alloc(DType::F32, tx.width(), tx.rows());
                h.st().store_row_f16({tx, to});
                return h.out(to);
            });
        })
        .def("compressor_store", [](OpHarness& h, W ape, uint32_t type, F32Array kv_cur, F32Array score_cur,
                                    F32Array state_kv, F32Array state_score, int ratio, int64_t head_dim, int64_t pos) {
            return h.call([&] {
                const int64_t width = (ratio == 4 ? 2 : 1) * head_dim;
                const TensorRef* ta = h.weight(ape, type, {width, ratio});
                Tensor tk = h.in(kv_cur, width), tsc = h.in(score_cur, width), sk = h.in(state_kv, width),
                       ss = h.in(state_score, width);
                h.st().compressor_store({ta, tk, tsc, sk, ss, ratio, head_dim, pos});
                return py::make_tuple(h.out(tsc), h.out(sk), h.out(ss));
            });
        })
        .def("compressor_pool", [](OpHarness& h, F32Array norm, F32Array state_kv, F32Array state_score, int ratio,
                                   int64_t head_dim, int64_t n_rot, float eps, Rope rope, int64_t pos, bool fp8) {
            return h.call([&] {
                const int64_t width = (ratio == 4 ? 2 : 1) * head_dim;
                Tensor sk = h.in(state_kv, width), ss = h.in(state_score, width), to = h.alloc(DType::F32, head_dim, 1);
                h.st().compressor_pool({h.f32_weight(norm), sk, ss, to, ratio, head_dim, n_rot, eps, rope_from(rope), pos,
                                        fp8});
                return h.out(to);
            });
        })
        .def("compressor_shift", [](OpHarness& h, F32Array state_kv, F32Array state_score, int64_t head_dim) {
            return h.call([&] {
                Tensor sk = h.in(state_kv, 2 * head_dim), ss = h.in(state_score, 2 * head_dim);
                h.st().compressor_shift({sk, ss, head_dim});
                return py::make_tuple(h.out(sk), h.out(ss));
            });
        })
        .def("indexer_scores", [](OpHarness& h, F32Array q, F32Array w, F32Array rows, int64_t n_head,
                                  int64_t head_dim, int64_t n_rot, int64_t pos, Rope rope) {
            return h.call([&] {
                Tensor tq = h.in(q, n_head * head_dim), tw = h.in(w, n_head), tr = h.in(rows, head_dim);
                Tensor ts = h.alloc(DType::F32, tr.rows(), 1);
                h.st().indexer_scores({tq, tw, tr, tr.rows(), n_head, head_dim, n_rot, pos, rope_from(rope), ts});
                return py::make_tuple(h.out(ts), h.out(tq), h.out(tw));
            });
        })
        .def("top_k_mask", [](OpHarness& h, F32Array scores, int64_t k) {
            return h.call([&] {
                const int64_t n = (int64_t)scores.size();
                Tensor ts = h.in(scores, n), tm = h.alloc(DType::U8, n, 1);
                h.st().top_k_mask({ts, n, k, tm});
                return h.out_u8(tm);
            });
        })
        .def("attention", [](OpHarness& h, F32Array q, F32Array raw, int64_t n_raw, int64_t raw_first, F32Array comp,
                             std::optional<py::array_t<uint8_t, py::array::c_style | py::array::forcecast>> mask,
                             F32Array sinks, int64_t n_head, int64_t head_dim) {
            return h.call([&] {
                Tensor tq = h.in(q, n_head * head_dim), tr = h.in(raw, head_dim), tc = h.in(comp, head_dim);
                const int64_t n_comp = (int64_t)comp.size() / head_dim;
                Tensor tm;
                if (mask) {
                    tm = h.alloc(DType::U8, n_comp, 1);
                    if (n_comp) h.st().upload(tm, mask->data(), (uint64_t)n_comp);
                }
                Tensor to = h.alloc(DType::F32, n_head * head_dim, 1);
                h.st().attention({tq, tr, tr.rows(), n_raw, raw_first, tc, n_comp, tm, h.f32_weight(sinks), n_head,
                                  head_dim, to});
                return h.out(to);
            });
        })
        .def("attention_block", [](OpHarness& h, F32Array q, F32Array raw, int64_t n_raw, int64_t raw_first,
                                   F32Array fresh, F32Array comp, std::vector<int64_t> n_comp,
                                   std::optional<py::array_t<uint8_t, py::array::c_style | py::array::forcecast>> mask,
                                   F32Array sinks, int64_t n_head, int64_t head_dim, int64_t mask_first) {
            return h.call([&] {
                Tensor tq = h.in(q, n_head * head_dim), tr = h.in(raw, head_dim), tf = h.in(fresh, head_dim);
                Tensor tc = h.in(comp, head_dim);
                const int64_t nq = tq.rows();
                if (nq < 1 || tf.rows() != nq || (int64_t)n_comp.size() != nq || n_raw < 0 || n_raw > tr.rows() ||
                    raw_first < 0 || raw_first >= tr.rows() || mask_first < 0 || mask_first > nq) {
                    fail(ErrorKind::InvalidArgument, "attention_block: q, fresh and n_comp need one entry per "
                                                     "query, and the ring a consistent live window");
                }
                for (size_t j = 0; j < n_comp.size(); ++j) {
                    const int64_t c = n_comp[j];
                    if (c < 0 || c > tc.rows() || (j && c < n_comp[j - 1])) {
                        fail(ErrorKind::InvalidArgument,
                             "attention_block: n_comp must be non-decreasing within the rows given");
                    }
                }
                Tensor tm;
                int64_t stride = 0;
                if (mask) {
                    stride = mask->ndim() == 2 ? (int64_t)mask->shape(1) : 0;
                    if (mask->ndim() != 2 || (int64_t)mask->shape(0) != nq || stride < n_comp.back()) {
                        fail(ErrorKind::InvalidArgument,
                             "attention_block: mask must be nq rows of at least n_comp[-1] flags");
                    }
                    tm = h.alloc(DType::U8, std::max<int64_t>(1, stride), nq);
                    if (stride) h.st().upload(tm, mask->data(), (uint64_t)(stride * nq));
                }
                Tensor to = h.alloc(DType::F32, n_head * head_dim, nq);
                h.st().attention_block({tq, tr, tr.rows(), n_raw, raw_first, tf, tc, n_comp.data(), tm, stride,
                                        mask_first, h.f32_weight(sinks), n_head, head_dim, to});
                return h.out(to);
            });
        })
        .def("router", [](OpHarness& h, F32Array logits, std::vector<int32_t> tokens, std::optional<F32Array> bias,
                          std::optional<I32Array> hash, int n_used, float scale) {
            return h.call([&] {
                const int n_expert = (int)logits.shape(logits.ndim() - 1);
                Tensor tl = h.in(logits, n_expert);
                const TensorRef* th = nullptr;
                if (hash) th = h.weight(*hash, (uint32_t)GgmlType::I32, {n_used, (int64_t)hash->size() / n_used});
                Tensor sel = h.alloc(DType::I32, n_used, tl.rows()), wts = h.alloc(DType::F32, n_used, tl.rows());
                h.st().router({tl, tokens.data(), h.f32_weight(bias), th, n_expert, n_used, scale, sel, wts});
                return py::make_tuple(h.out_i32(sel), h.out(wts));
            });
        })
        .def("routed_experts", [](OpHarness& h, W gate, uint32_t gate_type, W up, W down, uint32_t down_type,
                                  int64_t n_embd, int64_t n_ff, int n_expert, F32Array x, I32Array sel, F32Array weights,
                                  float clamp) {
            return h.call([&] {
                const TensorRef* tg = h.weight(gate, gate_type, {n_embd, n_ff, n_expert});
                const TensorRef* tu = h.weight(up, gate_type, {n_embd, n_ff, n_expert});
                const TensorRef* td = h.weight(down, down_type, {n_ff, n_embd, n_expert});
                const int n_used = (int)sel.shape(sel.ndim() - 1);
                Tensor tx = h.in(x, n_embd), ts = h.in_i32(sel, n_used), tw = h.in(weights, n_used);
                Tensor to = h.alloc(DType::F32, n_embd, tx.rows());
                h.st().routed_experts({tg, tu, td, tx, ts, tw, n_expert, n_used, n_ff, clamp, to});
                return h.out(to);
            });
        })
        .def("swiglu", [](OpHarness& h, F32Array g, F32Array u, float clamp, float scale) {
            return h.call([&] {
                Tensor tg = h.in(g), tu = h.in(u), to = h.alloc(DType::F32, tg.width(), tg.rows());
                h.st().swiglu({tg, tu, to, clamp, scale});
                return h.out(to);
            });
        })
        .def("add", [](OpHarness& h, F32Array a, F32Array b) {
            return h.call([&] {
                Tensor ta = h.in(a), tb = h.in(b), to = h.alloc(DType::F32, ta.width(), ta.rows());
                h.st().add({ta, tb, to});
                return h.out(to);
            });
        })
        .def("fill", [](OpHarness& h, int64_t width, int64_t rows, float value) {
            return h.call([&] {
                Tensor t = h.alloc(DType::F32, width, rows);
                h.st().fill({t, value});
                return h.out(t);
            });
        })
        .def("copy", [](OpHarness& h, F32Array x) {
            return h.call([&] {
                Tensor tx = h.in(x), to = h.alloc(DType::F32, tx.width(), tx.rows());
                h.st().copy({tx, to});
                return h.out(to);
            });
        })
        .def("argmax", [](OpHarness& h, F32Array x) {
            return h.call([&] {
                Tensor tx = h.in(x, (int64_t)x.size());
                int32_t best = -1;
                h.st().argmax({tx, &best});
                return best;
            });
        });
}
