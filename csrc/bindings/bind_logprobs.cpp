// ds4._core log-probabilities over 1-D float32 logits (ds4.sampling.top_logprobs / token_logprob
// wrap them and check the arguments; csrc/sampling/logprobs.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>


#include <optional>
#include <utility>
#include <vector>

#include "call_timer.h"
#include "sampling/logprobs.h"

namespace py = pybind11;

namespace {

using Logits = py::array_t<float, py::array::c_style | py::array::forcecast>;

// Below this many logits the call is too short for releasing the GIL to pay.
constexpr int64_t kReleaseGil = 4096;

struct Top {
    std::vector<int32_t> ids;
    double lse = 0.0;
    int64_t count = 0;
};

Top run_top(const float* a, int64_t n, int64_t k) {
    Top t;
    t.ids.resize((size_t)std::max<int64_t>(std::min(k, n), 0));
    t.count = ds4::top_finite_logits(a, n, k, t.ids.data(), &t.lse);
    return t;
}

}  // namespace

void init_logprobs(py::module_& m) {
    // (lse or None when no logit is finite, [(id, logit, logprob)] for the k best, the logprob of
    // `token` (-1: none asked; -1e30 when its logit is not finite) or None). Ids and k are checked
    // by the caller.
    m.def("top_logprobs",
          [](const Logits& logits, int64_t k, int64_t token) -> py::tuple {
              const float* a = logits.data();
              const int64_t n = logits.size();
              Top t;
              if (n >= kReleaseGil) {
                  py::gil_scoped_release nogil;
                  t = run_top(a, n, k);
              } else {
                  t = run_top(a, n, k);
              }
              if (t.lse != t.lse) return py::make_tuple(py::none(), py::list(), py::none());
              py::list top((size_t)t.count);
              for (int64_t i = 0; i < t.count; ++i) {
                  const float v = a[t.ids[(size_t)i]];
                  top[(size_t)i] = py::make_tuple(t.ids[(size_t)i], (double)v, ds4::logprob_of(v, t.lse));
              }
              py::object tok = py::none();
              if (token >= 0 && token < n) {
                  const float v = a[token];
                  tok = py::float_(ds4::logprob_of(v, t.lse));
              }
              return py::make_tuple(t.lse, std::move(top), tok);
          },
          py::arg("logits"), py::arg("k"), py::arg("token") = -1);
    m.def("_logsumexp", [](const Logits& logits) -> py::object {
              double lse = 0.0;
              bool ok;
              {
                  py::gil_scoped_release nogil;
                  ok = ds4::finite_logsumexp(logits.data(), logits.size(), &lse);
              }
              return ok ? py::object(py::float_(lse)) : py::object(py::none());
          }, py::arg("logits"));
    m.def("_logprob_sum", [](const Logits& logits) { return ds4::finite_exp_sum(logits.data(), logits.size()); },
          py::arg("logits"), "the sum behind the log-sum-exp (tests)");
    m.def("_logprob_exp",
          [](const py::array_t<double, py::array::c_style | py::array::forcecast>& d) {
              py::array_t<double> out(d.size());
              ds4::logprob_exp(d.data(), out.mutable_data(), d.size());
              return out;
          }, py::arg("d"), "the per-term exponential of the active build, for d in [-600, 0] (tests)");
    m.def("_logprob_bounds", []() { return py::make_tuple(ds4::kLogprobTermRel, ds4::kLogprobSumRel); });
    // Timing for bench/sampling.py: `reps` combined calls (top k and the lse) on the same logits;
    // (wall ns, thread CPU ns) per call.
    m.def("_time_logprobs",
          [](const Logits& logits, int64_t k, int reps) {
              const float* a = logits.data();
              const int64_t n = logits.size();
              return ds4_bind::time_calls(reps, [&] { return run_top(a, n, k).count >= 0; });   // keeps the call
          },
          py::arg("logits"), py::arg("k"), py::arg("reps"));
    // The floor under the log-sum-exp: the per-term exponential alone over d = l - max(l) (doubles
    // in, doubles out, no sum), `reps` times; (wall ns, thread CPU ns) per pass.
    m.def("_time_logprob_exp",
          [](const Logits& logits, int reps) {
              const float* a = logits.data();
              const int64_t n = logits.size();
              float m = a[0];
              for (int64_t i = 1; i < n; ++i) m = a[i] > m ? a[i] : m;
              std::vector<double> d((size_t)n), out((size_t)n);
              for (int64_t i = 0; i < n; ++i) d[(size_t)i] = (double)a[i] - (double)m;
              return ds4_bind::time_calls(reps, [&] {
                  ds4::logprob_exp(d.data(), out.data(), n);
                  return true;
              });
          },
          py::arg("logits"), py::arg("reps"));
}
