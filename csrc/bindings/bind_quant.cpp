// Internal kernel API on ds4._core, for tests and benches (not a public interface).
//
// Shapes follow GGUF/ggml order: ne0 (the row length n) first, e.g. (n, rows) for a matrix and
// (n, rows, n_expert) for an expert tensor; returned arrays are numpy order (rows last-dim n).
// Weight bytes may be any buffer (bytes, numpy uint8, memoryview) at any alignment; their size
// must equal the tensor's exact byte size. Float inputs are converted to contiguous float32.
//
//   dequantize(qtype, raw, shape) -> float32 array of reversed(shape)
//   quantize_act(wtype, x[..., n]) -> uint8 array of the activation blocks wtype consumes
//   matvec(qtype, raw, (n, rows), x[n]) -> y[rows]
//   matmul(qtype, raw, (n, rows), X[nb, n]) -> Y[nb, rows]
//   matvec_experts(qtype, raw, (n, rows, n_expert), ids[k], x[n] or X[k, n]) -> Y[k, rows]
//   matmul_experts(qtype, raw, (n, rows, n_expert), ids[T, k], X[T, n] or X[T, k, n]) -> Y[T, k, rows]
//   matvec_experts_pair(qtype, raw_a, raw_b, (n, rows, n_expert), ids[k], x[n]) -> (Y_a[k, rows], Y_b[k, rows])
//   simd_paths(), simd_path(), set_simd_path(name), threads(), set_threads(n), type_info(qtype)
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <mutex>
#include <utility>

#include <string>
#include <vector>

#include "common/decode_switches.h"
#include "common/errors.h"
#include "common/thread_pool.h"
#include "quant/gemm.h"
#include "quant/kernels.h"
#include "quant/matvec_experts_pair.h"
#include "quant/simd.h"

namespace py = pybind11;

namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

ds4::GgmlType checked_type(int qtype) {
    if (qtype < 0 || !ds4::is_known_type((uint32_t)qtype)) {
        ds4::fail(ds4::ErrorKind::Unsupported, "unknown GGML type id " + std::to_string(qtype));
    }
    return static_cast<ds4::GgmlType>(qtype);
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::string out = "(";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + (s.size() == 1 ? ",)" : ")");
}

void check_shape(const char* fn, const std::vector<int64_t>& shape, size_t want_dims) {
    if (want_dims && shape.size() != want_dims) {
        ds4::fail(ds4::ErrorKind::InvalidArgument, std::string(fn) + ": shape " + shape_str(shape) + " has " +
                                                       std::to_string(shape.size()) + " dims, expected " +
                                                       std::to_string(want_dims) + " (ggml order, ne0 first)");
    }
    if (shape.empty()) ds4::fail(ds4::ErrorKind::InvalidArgument, std::string(fn) + ": empty shape");
    for (int64_t d : shape) {
        if (d < 0) ds4::fail(ds4::ErrorKind::InvalidArgument, std::string(fn) + ": negative dim in " + shape_str(shape));
    }
}

// A contiguous byte view of `raw`, checked to hold exactly `expected` bytes.
const uint8_t* raw_bytes(const char* fn, ds4::GgmlType t, const py::buffer& raw, const std::vector<int64_t>& shape,
                         int64_t expected, py::buffer_info& info) {
    info = raw.request();
    int64_t stride = info.itemsize;
    for (ssize_t i = info.ndim - 1; i >= 0; --i) {
        if (info.shape[i] > 1 && info.strides[i] != stride) {
            ds4::fail(ds4::ErrorKind::InvalidArgument, std::string(fn) + ": weight buffer is not contiguous");
        }
        stride *= info.shape[i];
    }
    const int64_t nbytes = (int64_t)info.size * (int64_t)info.itemsize;
    if (nbytes != expected) {
        ds4::fail(ds4::ErrorKind::InvalidArgument,
                  std::string(fn) + ": " + ds4::type_traits(t).name + " tensor of shape " + shape_str(shape) +
                      " needs " + std::to_string(expected) + " bytes, buffer has " + std::to_string(nbytes));
    }
    return static_cast<const uint8_t*>(info.ptr);
}

int64_t product(const std::vector<int64_t>& s, size_t from = 1) {
    int64_t p = 1;
    for (size_t i = from; i < s.size(); ++i) p *= s[i];
    return p;
}

void check_vec(const char* fn, const FloatArray& x, int64_t n, int64_t rows_expected, const char* what) {
    // rows_expected < 0: 1-D x of n values; otherwise 2-D [rows_expected, n].
    const bool ok = rows_expected < 0 ? (x.ndim() == 1 && x.shape(0) == n)
                                      : (x.ndim() == 2 && x.shape(0) == rows_expected && x.shape(1) == n);
    if (!ok) {
        std::vector<int64_t> got(x.shape(), x.shape() + x.ndim());
        std::string want = rows_expected < 0 ? "(" + std::to_string(n) + ",)"
                                             : "(" + std::to_string(rows_expected) + ", " + std::to_string(n) + ")";
        ds4::fail(ds4::ErrorKind::InvalidArgument,
                  std::string(fn) + ": " + what + " has shape " + shape_str(got) + ", expected " + want);
    }
}

std::vector<uint8_t> quantize_rows(ds4::GgmlType t, const float* x, int64_t nrows, int64_t n) {
    const int64_t ab = ds4::act_bytes(t, n);
    std::vector<uint8_t> out((size_t)(ab * nrows));
    for (int64_t r = 0; r < nrows; ++r) ds4::quantize_act(t, x + r * n, out.data() + r * ab, n);
    return out;
}

ds4::SimdPath path_from_name(const std::string& name) {
    for (ds4::SimdPath p : {ds4::SimdPath::Scalar, ds4::SimdPath::AVX2, ds4::SimdPath::AVX512,
                            ds4::SimdPath::AVX512VNNI, ds4::SimdPath::NEON}) {
        if (name == ds4::simd_path_name(p)) return p;
    }
    ds4::fail(ds4::ErrorKind::InvalidArgument, "unknown SIMD path '" + name + "' (scalar, avx2, avx512, avx512vnni, neon)");
}

}  // namespace

void init_quant(py::module_& m) {
    m.def("type_info", [](int qtype) {
        const ds4::TypeTraits& tr = ds4::type_traits(checked_type(qtype));
        return py::make_tuple(tr.name, tr.block_elems, tr.block_bytes);
    }, py::arg("qtype"), "(name, block_elems, block_bytes) of a GGML type id");

    m.def("row_bytes", [](int qtype, int64_t n) { return ds4::row_bytes(checked_type(qtype), n); },
          py::arg("qtype"), py::arg("n"));

    m.def("act_bytes", [](int wtype, int64_t n) { return ds4::act_bytes(checked_type(wtype), n); },
          py::arg("wtype"), py::arg("n"), "bytes of the activation a wtype weight row of n consumes");

    m.def("dequantize", [](int qtype, const py::buffer& raw, std::vector<int64_t> shape) {
        const ds4::GgmlType t = checked_type(qtype);
        check_shape("dequantize", shape, 0);
        const int64_t n = shape[0], rows = product(shape);
        const int64_t expected = ds4::row_bytes(t, n) * rows;
        py::buffer_info info;
        const uint8_t* src = raw_bytes("dequantize", t, raw, shape, expected, info);
        std::vector<py::ssize_t> np_shape(shape.rbegin(), shape.rend());
        py::array_t<float> out(np_shape);
        float* dst = out.mutable_data();
        const int64_t rb = ds4::row_bytes(t, n);
        {
            py::gil_scoped_release nogil;
            for (int64_t r = 0; r < rows; ++r) ds4::dequantize_row(t, src + r * rb, dst + r * n, n);
        }
        return out;
    }, py::arg("qtype"), py::arg("raw"), py::arg("shape"));

    m.def("quantize_act", [](int wtype, const FloatArray& x) {
        const ds4::GgmlType t = checked_type(wtype);
        if (x.ndim() < 1) ds4::fail(ds4::ErrorKind::InvalidArgument, "quantize_act: x must have at least 1 dim");
        const int64_t n = x.shape(x.ndim() - 1), nrows = n ? (int64_t)x.size() / n : 0;
        const int64_t ab = ds4::act_bytes(t, n);
        std::vector<uint8_t> q;
        {
            py::gil_scoped_release nogil;
            q = quantize_rows(t, x.data(), nrows, n);
        }
        py::array_t<uint8_t> out({(py::ssize_t)nrows * ab});
        if (!q.empty()) std::memcpy(out.mutable_data(), q.data(), q.size());
        return out;
    }, py::arg("wtype"), py::arg("x"), "activation blocks (bytes) for each row of x[..., n], concatenated");

    m.def("matvec", [](int qtype, const py::buffer& raw, std::vector<int64_t> shape, const FloatArray& x) {
        const ds4::GgmlType t = checked_type(qtype);
        check_shape("matvec", shape, 2);
        const int64_t n = shape[0], rows = shape[1];
        py::buffer_info info;
        const uint8_t* w = raw_bytes("matvec", t, raw, shape, ds4::row_bytes(t, n) * rows, info);
        check_vec("matvec", x, n, -1, "x");
        ds4::act_bytes(t, n);
        py::array_t<float> y({(py::ssize_t)rows});
        float* yp = y.mutable_data();
        {
            py::gil_scoped_release nogil;
            std::vector<uint8_t> xq = quantize_rows(t, x.data(), 1, n);
            ds4::matvec(t, w, rows, n, xq.data(), yp);
        }
        return y;
    }, py::arg("qtype"), py::arg("raw"), py::arg("shape"), py::arg("x"));

    m.def("stream_read", [](const py::array_t<uint8_t, py::array::c_style | py::array::forcecast>& raw) {
        const uint8_t* p = raw.data();
        const int64_t bytes = (int64_t)raw.size();
        py::gil_scoped_release nogil;
        return ds4::stream_read(p, bytes);
    }, py::arg("raw"), "reads every byte of a contiguous buffer on the thread pool; returns a checksum "
                       "(time it for the read bandwidth)");

    m.def("matmul", [](int qtype, const py::buffer& raw, std::vector<int64_t> shape, const FloatArray& X) {
        const ds4::GgmlType t = checked_type(qtype);
        check_shape("matmul", shape, 2);
        const int64_t n = shape[0], rows = shape[1];
        py::buffer_info info;
        const uint8_t* w = raw_bytes("matmul", t, raw, shape, ds4::row_bytes(t, n) * rows, info);
        if (X.ndim() != 2) ds4::fail(ds4::ErrorKind::InvalidArgument, "matmul: X must be 2-D [nb, n]");
        const int64_t nb = X.shape(0);
        check_vec("matmul", X, n, nb, "X");
        ds4::act_bytes(t, n);
        py::array_t<float> y({(py::ssize_t)nb, (py::ssize_t)rows});
        float* yp = y.mutable_data();
        {
            py::gil_scoped_release nogil;
            std::vector<uint8_t> xq = quantize_rows(t, X.data(), nb, n);
            ds4::matmul(t, w, rows, n, xq.data(), nb, yp);
        }
        return y;
    }, py::arg("qtype"), py::arg("raw"), py::arg("shape"), py::arg("X"));

    m.def("matvec_experts", [](int qtype, const py::buffer& raw, std::vector<int64_t> shape,
                               const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& ids,
                               const FloatArray& x) {
        const ds4::GgmlType t = checked_type(qtype);
        check_shape("matvec_experts", shape, 3);
        const int64_t n = shape[0], rows = shape[1], n_expert = shape[2];
        py::buffer_info info;
        const uint8_t* w = raw_bytes("matvec_experts", t, raw, shape, ds4::row_bytes(t, n) * rows * n_expert, info);
        if (ids.ndim() != 1) ds4::fail(ds4::ErrorKind::InvalidArgument, "matvec_experts: ids must be 1-D");
        const int64_t k = ids.shape(0);
        const bool shared = x.ndim() == 1;
        check_vec("matvec_experts", x, n, shared ? -1 : k, "x");
        const int64_t ab = ds4::act_bytes(t, n);
        py::array_t<float> y({(py::ssize_t)k, (py::ssize_t)rows});
        float* yp = y.mutable_data();
        {
            py::gil_scoped_release nogil;
            std::vector<uint8_t> xq = quantize_rows(t, x.data(), shared ? 1 : k, n);
            ds4::matvec_experts(t, w, n_expert, rows, n, ids.data(), k, xq.data(), shared ? 0 : ab, yp);
        }
        return y;
    }, py::arg("qtype"), py::arg("raw"), py::arg("shape"), py::arg("ids"), py::arg("x"));

    m.def("matvec_experts_pair", [](int qtype, const py::buffer& raw_a, const py::buffer& raw_b,
                                    std::vector<int64_t> shape,
                                    const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& ids,
                                    const FloatArray& x) {
        const ds4::GgmlType t = checked_type(qtype);
        check_shape("matvec_experts_pair", shape, 3);
        const int64_t n = shape[0], rows = shape[1], n_expert = shape[2];
        const int64_t bytes = ds4::row_bytes(t, n) * rows * n_expert;
        py::buffer_info ia, ib;
        const uint8_t* wa = raw_bytes("matvec_experts_pair", t, raw_a, shape, bytes, ia);
        const uint8_t* wb = raw_bytes("matvec_experts_pair", t, raw_b, shape, bytes, ib);
        if (ids.ndim() != 1) ds4::fail(ds4::ErrorKind::InvalidArgument, "matvec_experts_pair: ids must be 1-D");
        const int64_t k = ids.shape(0);
        check_vec("matvec_experts_pair", x, n, -1, "x");
        py::array_t<float> ya({(py::ssize_t)k, (py::ssize_t)rows}), yb({(py::ssize_t)k, (py::ssize_t)rows});
        float* pa = ya.mutable_data();
        float* pb = yb.mutable_data();
        {
            py::gil_scoped_release nogil;
            std::vector<uint8_t> xq = quantize_rows(t, x.data(), 1, n);
            ds4::matvec_experts_pair(t, wa, wb, n_expert, rows, n, ids.data(), k, xq.data(), pa, pb);
        }
        return py::make_tuple(ya, yb);
    }, py::arg("qtype"), py::arg("raw_a"), py::arg("raw_b"), py::arg("shape"), py::arg("ids"), py::arg("x"));

    m.def("matmul_experts", [](int qtype, const py::buffer& raw, std::vector<int64_t> shape,
                               const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& ids,
                               const FloatArray& x) {
        const ds4::GgmlType t = checked_type(qtype);
        check_shape("matmul_experts", shape, 3);
        const int64_t n = shape[0], rows = shape[1], n_expert = shape[2];
        py::buffer_info info;
        const uint8_t* w = raw_bytes("matmul_experts", t, raw, shape, ds4::row_bytes(t, n) * rows * n_expert, info);
        if (ids.ndim() != 2) ds4::fail(ds4::ErrorKind::InvalidArgument, "matmul_experts: ids must be 2-D [tokens, n_used]");
        const int64_t nt = ids.shape(0), nu = ids.shape(1);
        const bool per_token = x.ndim() == 2;
        const bool ok = per_token ? (x.shape(0) == nt && x.shape(1) == n)
                                  : (x.ndim() == 3 && x.shape(0) == nt && x.shape(1) == nu && x.shape(2) == n);
        if (!ok) {
            std::vector<int64_t> got(x.shape(), x.shape() + x.ndim());
            ds4::fail(ds4::ErrorKind::InvalidArgument,
                      "matmul_experts: x has shape " + shape_str(got) + ", expected (" + std::to_string(nt) + ", " +
                          std::to_string(n) + ") or (" + std::to_string(nt) + ", " + std::to_string(nu) + ", " +
                          std::to_string(n) + ")");
        }
        const int64_t ab = ds4::act_bytes(t, n);
        py::array_t<float> y({(py::ssize_t)nt, (py::ssize_t)nu, (py::ssize_t)rows});
        float* yp = y.mutable_data();
        {
            py::gil_scoped_release nogil;
            std::vector<uint8_t> xq = quantize_rows(t, x.data(), per_token ? nt : nt * nu, n);
            ds4::matmul_experts(t, w, n_expert, rows, n, ids.data(), nt, nu, xq.data(), per_token ? ab : nu * ab,
                                per_token ? 0 : ab, yp);
        }
        return y;
    }, py::arg("qtype"), py::arg("raw"), py::arg("shape"), py::arg("ids"), py::arg("x"));

    m.def("simd_paths", [] {
        std::vector<std::string> out;
        for (ds4::SimdPath p : ds4::available_simd_paths()) out.emplace_back(ds4::simd_path_name(p));
        return out;
    }, "SIMD paths this CPU and build can run, slowest first");
    m.def("simd_path", [] { return std::string(ds4::simd_path_name(ds4::simd_path())); });
    m.def("set_simd_path", [](const std::string& name) { ds4::set_simd_path(path_from_name(name)); },
          py::arg("name"));

    m.def("threads", [] { return ds4::ThreadPool::global().size(); }, "size of the global CPU thread pool");
    m.def("set_threads", [](int n) {
        if (n < 0) ds4::fail(ds4::ErrorKind::InvalidArgument, "set_threads: n must be >= 0 (0 = default)");
        py::gil_scoped_release nogil;
        ds4::ThreadPool::set_global_threads(n);
    }, py::arg("n"), "resize the global pool (0 = default: DS4_THREADS or physical cores)");
    m.def("default_threads", [] { return ds4::default_thread_count(); });
    // The pool's range cut (common/range_split.h), and the ranges a real parallel_for on the global
    // pool ran: tests check both cover [0, n) once and that the tapered cut ends short.
    m.def("_split_bounds", [](int64_t n, int threads, int64_t min_chunk, int ranges_per_thread, bool tapered) {
        std::vector<int64_t> b;
        ds4::split_bounds(n, threads, min_chunk, ranges_per_thread, tapered ? ds4::Split::Tapered : ds4::Split::Even,
                          b);
        return b;
    }, py::arg("n"), py::arg("threads"), py::arg("min_chunk"), py::arg("ranges_per_thread"), py::arg("tapered"));
    m.def("_decode_switches", [](py::object tapered, py::object warm_hc, py::object prewake, py::object q8_prefetch,
                                 py::object half_prefetch, py::object q8_prefetch_inline) {
        ds4::DecodeSwitches& s = ds4::decode_switches();
        // Prefetch distances in bytes: 0 (none) to 1 MiB. Checked first: a bad call changes nothing.
        auto distance = [](const char* what, const py::object& v) {
            const long long d = v.cast<long long>();
            if (d < 0 || d > (1 << 20))
                ds4::fail(ds4::ErrorKind::InvalidArgument, std::string(what) + ": " + std::to_string(d) +
                                                               " is outside [0, 1 MiB]");
            return (int)d;
        };
        const int q8 = q8_prefetch.is_none() ? s.q8_prefetch.load() : distance("q8_prefetch", q8_prefetch);
        const int half = half_prefetch.is_none() ? s.half_prefetch.load() : distance("half_prefetch", half_prefetch);
        if (!tapered.is_none()) s.tapered = tapered.cast<bool>();
        if (!warm_hc.is_none()) s.warm_hc = warm_hc.cast<bool>();
        if (!prewake.is_none()) s.prewake = prewake.cast<bool>();
        if (!q8_prefetch_inline.is_none()) s.q8_prefetch_inline = q8_prefetch_inline.cast<bool>();
        s.q8_prefetch = q8;
        s.half_prefetch = half;
        return py::dict(py::arg("tapered") = s.tapered.load(), py::arg("warm_hc") = s.warm_hc.load(),
                        py::arg("prewake") = s.prewake.load(), py::arg("q8_prefetch") = s.q8_prefetch.load(),
                        py::arg("half_prefetch") = s.half_prefetch.load(),
                        py::arg("q8_prefetch_inline") = s.q8_prefetch_inline.load());
    }, py::arg("tapered") = py::none(), py::arg("warm_hc") = py::none(), py::arg("prewake") = py::none(),
       py::arg("q8_prefetch") = py::none(), py::arg("half_prefetch") = py::none(),
       py::arg("q8_prefetch_inline") = py::none(),
       "the decode-glue switches (common/decode_switches.h): set the given ones, return all");
    // A SideJob on the global pool whose ranges each take range_us; the caller finishes it after
    // wait_us. Returns (finish()'s count, ranges seen started, ranges still running when finish()
    // returned, the ranges run).
    m.def("_side_job", [](int64_t n, int64_t n_ranges, int64_t range_us, int64_t wait_us) {
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> ran;
        std::atomic<int> running{0};
        int64_t count = 0;
        int still_running = 0;
        {
            py::gil_scoped_release nogil;
            const std::function<void(int64_t, int64_t)> fn = [&](int64_t b, int64_t e) {
                running.fetch_add(1);
                std::this_thread::sleep_for(std::chrono::microseconds(range_us));
                {
                    std::lock_guard<std::mutex> lk(mu);
                    ran.emplace_back(b, e);
                }
                running.fetch_sub(1);
            };
            ds4::ThreadPool::SideJob side(ds4::ThreadPool::global(), n, n_ranges, fn);
            std::this_thread::sleep_for(std::chrono::microseconds(wait_us));
            count = side.finish();
            still_running = running.load();
        }
        std::sort(ran.begin(), ran.end());
        return py::make_tuple(count, (int64_t)ran.size(), still_running, ran);
    }, py::arg("n"), py::arg("n_ranges"), py::arg("range_us"), py::arg("wait_us"));
    m.def("_pool_ranges", [](int64_t n, int64_t min_chunk, int ranges_per_thread, bool tapered) {
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> ran;
        {
            py::gil_scoped_release nogil;
            ds4::ThreadPool::global().parallel_for(
                n,
                [&](int64_t b, int64_t e) {
                    std::lock_guard<std::mutex> lk(mu);
                    ran.emplace_back(b, e);
                },
                min_chunk, ranges_per_thread, tapered ? ds4::Split::Tapered : ds4::Split::Even);
        }
        std::sort(ran.begin(), ran.end());
        return ran;
    }, py::arg("n"), py::arg("min_chunk"), py::arg("ranges_per_thread"), py::arg("tapered"));
    m.def("int8_dot_peak", [](int64_t iters) {
        ds4::quant::DotPeak p;
        {
            py::gil_scoped_release nogil;
            p = ds4::quant::int8_dot_peak(ds4::ThreadPool::global(), iters);
        }
        return py::dict(py::arg("macs") = p.macs, py::arg("wall_s") = p.wall_s, py::arg("cpu_s") = p.cpu_s);
    }, py::arg("iters"), "tight vpdpbusd loop on every pool thread (bench/kernels.py's int8 peak); macs 0 without VNNI");
    m.def("gemm_active", [](int qtype, int64_t n) {
        return ds4::quant::active_gemm(checked_type(qtype), nullptr, n) != nullptr;
    }, py::arg("qtype"), py::arg("n"),
          "whether matmul runs the register-blocked GEMM (docs/gemm.md) for this weight type on the active "
          "SIMD path (given enough tokens); False: the row kernels");
}
