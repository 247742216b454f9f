// ds4._core sampling functions over 1-D float32 logits (ds4.sampling wraps them; parameters are
// normalised there). The RNG state travels in and out as an integer so ds4.sampling.Rng stays the
// one owner of it. One Sampler (scratch buffers) per thread.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <pybind11/stl.h>


#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>
#include <utility>

#include "common/errors.h"
#include "engine/model.h"
#include "call_timer.h"
#include "sampling/binade_sum.h"
#include "sampling/bucket_collect.h"
#include "sampling/bucket_topp.h"
#include "sampling/exp_weights.h"
#include "sampling/scale_weights.h"
#include "sampling/sampler.h"
#include "sampling/sampling_pool.h"
#include "sampling/scan.h"

namespace py = pybind11;

namespace {

using Logits = py::array_t<float, py::array::c_style | py::array::forcecast>;

ds4::Sampler& thread_sampler() {
    thread_local ds4::Sampler s;
    return s;
}

ds4::SamplerParams params(float t, long long k, float p, float mp) {
    ds4::SamplerParams sp;
    sp.temperature = t;
    sp.top_k = (int)std::max(-1LL, std::min(k, 1LL << 30));
    sp.top_p = p;
    sp.min_p = mp;
    return sp;
}

// The pool a call may split over (sampling_pool.h): a Model lends its backend's workers, False
// keeps the call on the calling thread, None leaves the process-wide setting (set_sampling_threads).
struct PoolOf {
    ds4::ThreadPool* pool = nullptr;
    bool set = false;
    explicit PoolOf(const py::object& pool_of) {
        if (pool_of.is_none()) return;
        set = true;
        if (py::isinstance<py::bool_>(pool_of)) {
            if (pool_of.cast<bool>()) ds4::fail(ds4::ErrorKind::InvalidArgument, "pool_of: a Model, False or None");
            return;
        }
        pool = pool_of.cast<ds4::Model&>().backend().host_pool();
    }
};

}  // namespace

void init_sampling(py::module_& m) {
    m.def("sample",
          [](const Logits& logits, float t, long long k, float p, float mp, uint64_t state, const py::object& pool_of) {
              const float* a = logits.data();
              const int64_t n = logits.size();
              const ds4::SamplerParams sp = params(t, k, p, mp);
              const PoolOf po(pool_of);
              int32_t tok;
              {
                  py::gil_scoped_release nogil;
                  std::optional<ds4::SamplingPoolScope> scope;
                  if (po.set) scope.emplace(po.pool);
                  tok = thread_sampler().sample(a, n, sp, state);
              }
              return std::make_pair(tok, state);
          },
          py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"),
          py::arg("rng_state"), py::arg("pool_of") = py::none());
    m.def("sample_probabilities",
          [](const Logits& logits, float t, long long k, float p, float mp, const py::object& pool_of) {
              const int64_t n = logits.size();
              py::array_t<float> out(n);
              const float* a = logits.data();
              float* o = out.mutable_data();
              const ds4::SamplerParams sp = params(t, k, p, mp);
              const PoolOf po(pool_of);
              {
                  py::gil_scoped_release nogil;
                  std::optional<ds4::SamplingPoolScope> scope;
                  if (po.set) scope.emplace(po.pool);
                  thread_sampler().probabilities(a, n, sp, o);
              }
              return out;
          },
          py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"),
          py::arg("pool_of") = py::none());
    // The sampler's building blocks, for tests (tests/test_sampling.py): each equals a plain loop.
    m.def("_binade_seq_sum", [](const Logits& w) { return ds4::binade_seq_sum(w.data(), w.size()); }, py::arg("w"));
    m.def("_binade_seq_sum_from", [](const Logits& w, float s) { return ds4::binade_seq_sum_from(w.data(), w.size(), s); },
          py::arg("w"), py::arg("s"));
    m.def("_binade_seq_walk", [](const Logits& w, float r) { return ds4::binade_seq_walk(w.data(), w.size(), r); },
          py::arg("w"), py::arg("r"));
    m.def("_binade_weight_total", [](const Logits& x) { return ds4::binade_weight_total(x.data(), x.size(), nullptr); },
          py::arg("x"));
    m.def("_binade_weight_walk",
          [](const Logits& x, float r) { return ds4::binade_weight_walk(x.data(), nullptr, x.size(), r); },
          py::arg("x"), py::arg("r"));
    m.def("_exp_weights", [](const Logits& x) {
              py::array_t<float> out(x.size());
              ds4::exp_weights(x.data(), out.mutable_data(), x.size());
              return out;
          }, py::arg("x"));
    m.def("_exp_weights_of_logits", [](const Logits& a, float m, float t, bool all_finite) {
              py::array_t<float> out(a.size());
              ds4::exp_weights_of_logits(a.data(), a.size(), m, t, all_finite, out.mutable_data());
              return out;
          }, py::arg("a"), py::arg("m"), py::arg("t"), py::arg("all_finite"));
    // scale_weights on a copy of w, in place (as probabilities() runs it) or into a second array.
    m.def("_scale_weights", [](const Logits& w, double inv, bool in_place) {
              py::array_t<float> out(w.size());
              float* o = out.mutable_data();
              if (in_place) {
                  std::copy(w.data(), w.data() + w.size(), o);
                  ds4::scale_weights(o, w.size(), inv, o);
              } else {
                  ds4::scale_weights(w.data(), w.size(), inv, o);
              }
              return out;
          }, py::arg("w"), py::arg("inv"), py::arg("in_place"));
    m.def("_approx_exp_weights", [](const Logits& x) {
              py::array_t<float> out(x.size());
              ds4::approx_exp_weights(x.data(), out.mutable_data(), x.size());
              return out;
          }, py::arg("x"));
    m.def("_approx_weight_rel", []() { return ds4::kApproxWeightRel; });
    // The bucket partition on given weights (exact w, approximations wa within rel): None when it
    // does not decide, else (kept count, sum, kept ids bucket by bucket, the walk's id per r,
    // tokens in sorted buckets).
    m.def("_bucket_top_p",
          [](const Logits& a, const Logits& w, const Logits& wa, float rel, float total, float top_p, int buckets,
             const Logits& rs, float floor, float t) -> py::object {
              const int64_t n = a.size();
              if (w.size() != n || wa.size() != n) throw py::value_error("a, w and wa differ in length");
              float hi = -__builtin_inff(), lo = __builtin_inff();
              bool all_finite = true;
              std::vector<int32_t> sub;   // floor given: the prefix of finite logits >= floor, as the sampler collects it
              for (int64_t i = 0; i < n; ++i) {
                  const float v = a.data()[i];
                  if (!(v - v == 0.0f)) { all_finite = false; continue; }
                  hi = std::max(hi, v);
                  lo = std::min(lo, v);
                  if (v >= floor) sub.push_back((int32_t)i);
              }
              if (!(hi >= lo)) return py::none();
              const bool prefix = floor - floor == 0.0f;
              if (prefix) lo = floor;   // a bound at or below the prefix's logits, as the sampler passes
              // t given: the exact weights are the sampler's, exp_weights(fl(fl(a - hi) / t)) (w must hold
              // them), so the whole-vocabulary partition may certify buckets from their logit bounds.
              const bool formula = t > 0.0f;
              ds4::BucketTopPInput in{a.data(), prefix ? (int64_t)sub.size() : n, hi, lo, all_finite, wa.data(), rel,
                                      formula ? nullptr : w.data(), hi, formula ? t : 1.0f, total, top_p, buckets};
              if (prefix) {
                  if (sub.empty()) return py::none();
                  in.sub = sub.data();
              }
              ds4::BucketTopP b;
              if (!b.select(in)) return py::none();
              py::array_t<int32_t> kept(b.count());
              b.kept_ids(kept.mutable_data());
              std::vector<int64_t> picks;
              for (int64_t i = 0; i < rs.size(); ++i) picks.push_back(b.walk(rs.data()[i]));
              return py::make_tuple(b.count(), b.sum(), kept, picks, b.sorted_tokens());
          },
          py::arg("a"), py::arg("w"), py::arg("wa"), py::arg("rel"), py::arg("total"), py::arg("top_p"),
          py::arg("buckets"), py::arg("rs"), py::arg("floor") = std::numeric_limits<float>::quiet_NaN(),
          py::arg("t") = 0.0f);
    m.def("_bucket_top_p_collections", &ds4::bucket_top_p_collections);
    m.def("_set_bucket_top_p_plan", &ds4::set_bucket_top_p_plan, py::arg("v"),
          "0: each collection pass also takes the buckets predicted to need ids; 1: only the one asking (tests)");
    m.def("_bucket_top_p_plan", &ds4::bucket_top_p_plan);
    m.def("_set_bucket_top_p_min_kept", &ds4::set_bucket_top_p_min_kept, py::arg("v"),
          "the sampler's bucket branch runs when more tokens than this are kept (0: always, inf: never)");
    m.def("_bucket_top_p_min_kept", &ds4::bucket_top_p_min_kept);
    m.def("_bucket_top_p_selections", &ds4::bucket_top_p_selections);
    m.def("_bucket_top_p_prefix_selections", &ds4::bucket_top_p_prefix_selections);
    m.def("_set_bucket_top_p_prefix_min", &ds4::set_bucket_top_p_prefix_min, py::arg("v"),
          "a collected top-p prefix of at least this many tokens goes through the bucket partition (inf: never)");
    m.def("_bucket_top_p_prefix_min", &ds4::bucket_top_p_prefix_min);
    m.def("_set_bucket_top_p_early_max", &ds4::set_bucket_top_p_early_max, py::arg("v"),
          "the top-p prefix is collected after the max pass when a sample puts it at most this long (0: never, inf: always)");
    m.def("_bucket_top_p_early_max", &ds4::bucket_top_p_early_max);
    // The whole vocabulary's total and walk with reciprocal-argument approximations (rel from
    // _reciprocal_weight_rel; 0 falls back to the divided arguments), and that bound.
    m.def("_reciprocal_weight_rel", &ds4::reciprocal_weight_rel, py::arg("m"), py::arg("t"), py::arg("lowest"));
    m.def("_binade_logit_total_rcp",
          [](const Logits& a, float m, float t, float lowest, float rel) {
              return ds4::binade_logit_total_rcp(a.data(), a.size(), m, t, false, lowest, rel, nullptr);
          }, py::arg("logits"), py::arg("m"), py::arg("t"), py::arg("lowest"), py::arg("rel"));
    m.def("_binade_logit_walk_rcp",
          [](const Logits& a, float m, float t, float lowest, float rel, float r) {
              return ds4::binade_logit_walk_rcp(a.data(), a.size(), m, t, false, lowest, rel, nullptr, r);
          }, py::arg("logits"), py::arg("m"), py::arg("t"), py::arg("lowest"), py::arg("rel"), py::arg("r"));
    m.def("_sorted_finite_ids", [](const Logits& a) {
              const std::vector<int32_t> ids = ds4::sorted_finite_ids(a.data(), a.size());
              return py::array_t<int32_t>((py::ssize_t)ids.size(), ids.data());
          }, py::arg("logits"));
    // The whole-vocabulary scans (tests/test_sampling_scans.py compares them with numpy on every
    // SIMD path; the vector builds hand their last <16 entries to the scalar loops).
    m.def("_collect_finite_at_least", [](const Logits& a, float floor) {
              const int64_t n = a.size();
              std::vector<int32_t> ids((size_t)n + 16);
              std::vector<float> vals((size_t)n + 16);
              const int64_t k = ds4::collect_finite_at_least(a.data(), n, floor, ids.data(), vals.data());
              ids.resize((size_t)k);
              vals.resize((size_t)k);
              return py::make_tuple(py::array_t<int32_t>(k, ids.data()), py::array_t<float>(k, vals.data()));
          }, py::arg("a"), py::arg("floor"));
    // The top-p prefix's packed words (bucket_collect.h) on the current SIMD path;
    // tests/test_sampling_prefix.py compares the vector loop with the scalar one and with numpy.
    m.def("_collect_prefix", [](const Logits& a, float floor, float hi, float scale, int id_bits, int fine_bits,
                                bool all_finite) {
              const int64_t n = a.size();
              if (id_bits < 1 || fine_bits < 1 || fine_bits > 16 || id_bits + fine_bits > 32 || n > (int64_t(1) << id_bits) ||
                  !(scale > 0.0f) || !std::isfinite(floor))
                  ds4::fail(ds4::ErrorKind::InvalidArgument, "_collect_prefix: needs n <= 2^id_bits, fine_bits <= 16, "
                                                             "id_bits + fine_bits <= 32, scale > 0, a finite floor");
              ds4::PrefixGrid g;
              g.hi = hi;
              g.scale = scale;
              g.id_bits = id_bits;
              g.fine_bits = fine_bits;
              std::vector<uint32_t> out((size_t)n + 64);
              const int64_t k = ds4::collect_prefix(a.data(), n, floor, g, all_finite, out.data());
              return py::array_t<uint32_t>(k, out.data());
          }, py::arg("a"), py::arg("floor"), py::arg("hi"), py::arg("scale"), py::arg("id_bits"), py::arg("fine_bits"),
          py::arg("all_finite") = false);
    m.def("_collect_above_and_tied", [](const Logits& a, float v, int64_t limit) {
              const int64_t n = a.size();
              std::vector<int32_t> above((size_t)n + 16), tied((size_t)std::max<int64_t>(limit, 0) + 16);
              std::vector<float> vals((size_t)n + 16);
              int64_t n_tied = 0;
              const int64_t k = ds4::collect_above_and_tied(a.data(), n, v, above.data(), vals.data(), limit,
                                                            tied.data(), &n_tied);
              return py::make_tuple(py::array_t<int32_t>(k, above.data()), py::array_t<float>(k, vals.data()),
                                    py::array_t<int32_t>(n_tied, tied.data()));
          }, py::arg("a"), py::arg("v"), py::arg("limit"));
    m.def("_finite_max", [](const Logits& a) {
              int64_t n_finite = 0;
              float lo = 0.0f;
              const float hi = ds4::finite_max(a.data(), a.size(), &n_finite, &lo);
              return py::make_tuple(hi, n_finite, lo);
          }, py::arg("a"));
    m.def("_shifted_args", [](const Logits& a, float m, float t) {
              py::array_t<float> out(a.size() + 16);
              const int64_t c = ds4::shifted_args(a.data(), a.size(), m, t, out.mutable_data());
              return py::make_tuple(out[py::slice(0, a.size(), 1)], c);
          }, py::arg("a"), py::arg("m"), py::arg("t"));
    m.def("_first_ratio_below", [](const Logits& w, float total, float bound) {
              return ds4::first_ratio_below(w.data(), w.size(), total, bound);
          }, py::arg("w"), py::arg("total"), py::arg("bound"));
    m.def("_mass_in", [](const Logits& w, float lo, float hi, int step) {
              return ds4::mass_in(w.data(), w.size(), lo, hi, step);
          }, py::arg("w"), py::arg("lo"), py::arg("hi"), py::arg("step"));
    m.def("set_sampling_threads", &ds4::set_sampling_threads, py::arg("n"),
          "let the sampler split its whole-vocabulary passes over the global pool (1: one thread)");
    m.def("sampling_threads", &ds4::sampling_threads);
    // Timing for bench/sampling.py: `reps` calls of the C++ sampler (or probabilities) on the same
    // logits; returns (wall ns, thread CPU ns) per call.
    m.def("_time_sampler",
          [](const Logits& logits, float t, long long k, float p, float mp, int reps, bool probs) {
              const float* a = logits.data();
              const int64_t n = logits.size();
              const ds4::SamplerParams sp = params(t, k, p, mp);
              std::vector<float> out(probs ? (size_t)n : 0);
              uint64_t state = 1;
              return ds4_bind::time_calls(reps, [&] {
                  if (probs) thread_sampler().probabilities(a, n, sp, out.data());
                  else thread_sampler().sample(a, n, sp, state);
                  return true;
              });
          },
          py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"),
          py::arg("reps"), py::arg("probabilities") = false);
    m.def("argmax", [](const Logits& logits) { return ds4::argmax_logits(logits.data(), logits.size()); },
          py::arg("logits"));
}
