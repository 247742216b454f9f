// ds4._core log-probabilities over 1-D float32 logits (ds4.sampling.top_logprobs / token_logprob
// wrap them and check the arguments; csrc/sampling/logprobs.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <time.h>

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "sampling/logprobs.h"

namespace py = pybind11;

namespace {

using Logits = py::array_t<float, py::array::c_style | py::array::forcecast>;

// Below this many logits the call is too short for releasing the GIL to pay.
constexpr int64_t kReleaseGil = 4096;

// What a non-finite token logit reports (upstream's DS4_NEG_INF, returned as the double -1e30).
constexpr double kNonFinite = -1.0e30;

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
                  top[(size_t)i] = py::make_tuple(t.ids[(size_t)i], (double)v, (double)ds4::logprob_of(v, t.lse, 0.0f));
              }
              py::object tok = py::none();
              if (token >= 0 && token < n) {
                  const float v = a[token];
                  tok = py::float_(v - v == 0.0f ? (double)ds4::logprob_of(v, t.lse, 0.0f) : kNonFinite);
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
              std::vector<std::pair<int64_t, int64_t>> r;
              {
                  py::gil_scoped_release nogil;
                  for (int i = 0; i < reps; ++i) {
                      timespec c0, c1;
                      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
                      const auto w0 = std::chrono::steady_clock::now();
                      const Top t = run_top(a, n, k);
                      const auto w1 = std::chrono::steady_clock::now();
                      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
                      if (t.count < 0) break;   // keeps the call
                      r.emplace_back(std::chrono::duration_cast<std::chrono::nanoseconds>(w1 - w0).count(),
                                     (c1.tv_sec - c0.tv_sec) * 1000000000LL + (c1.tv_nsec - c0.tv_nsec));
                  }
              }
              return r;
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
              std::vector<std::pair<int64_t, int64_t>> r;
              {
                  py::gil_scoped_release nogil;
                  for (int i = 0; i < reps; ++i) {
                      timespec c0, c1;
                      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
                      const auto w0 = std::chrono::steady_clock::now();
                      ds4::logprob_exp(d.data(), out.data(), n);
                      const auto w1 = std::chrono::steady_clock::now();
                      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
                      r.emplace_back(std::chrono::duration_cast<std::chrono::nanoseconds>(w1 - w0).count(),
                                     (c1.tv_sec - c0.tv_sec) * 1000000000LL + (c1.tv_nsec - c0.tv_nsec));
                  }
              }
              return r;
          },
          py::arg("logits"), py::arg("reps"));
}
