// ds4._core.Session: one inference timeline. Long calls release the GIL; between prefill chunks
// they take it back to run the progress callback and check for signals / a cancel request.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/errors.h"
#include "session/session.h"

namespace py = pybind11;

namespace {

struct PySession {
    std::shared_ptr<ds4::Session> s;
    std::atomic<bool> cancel{false};
};

std::vector<int32_t> to_tokens(const py::handle& obj) {
    std::vector<int32_t> out;
    for (const py::handle& h : obj) {
        const long long v = h.cast<long long>();
        if (v < INT32_MIN || v > INT32_MAX) ds4::fail(ds4::ErrorKind::InvalidArgument, "token id " + std::to_string(v) + " is out of range");
        out.push_back((int32_t)v);
    }
    return out;
}

}  // namespace

void init_session(py::module_& m) {
    py::class_<PySession, std::shared_ptr<PySession>>(m, "Session")
        .def(py::init([](std::shared_ptr<ds4::Model> model, int64_t ctx) {
                 auto p = std::make_shared<PySession>();
                 p->s = std::make_shared<ds4::Session>(model, ctx);
                 return p;
             }),
             py::arg("model"), py::arg("ctx"))
        .def_property_readonly("pos", [](PySession& p) { return p.s->pos(); })
        .def_property_readonly("ctx", [](PySession& p) { return p.s->ctx(); })
        .def_property_readonly("tokens", [](PySession& p) { return p.s->tokens(); })
        .def_property_readonly("has_logits", [](PySession& p) { return p.s->has_logits(); })
        .def("logits_view",
             [](py::object self) {
                 PySession& p = self.cast<PySession&>();
                 const float* data;
                 {
                     py::gil_scoped_release nogil;
                     data = p.s->logits();
                 }
                 const int64_t V = p.s->model().shape().n_vocab;
                 py::array_t<float> a({V}, {(int64_t)sizeof(float)}, data, self);
                 py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
                 return a;
             })
        .def("argmax", [](PySession& p) {
            py::gil_scoped_release nogil;
            return p.s->argmax();
        })
        .def("eval",
             [](PySession& p, long long token) {
                 if (token < INT32_MIN || token > INT32_MAX) {
                     ds4::fail(ds4::ErrorKind::InvalidArgument, "token id " + std::to_string(token) + " is out of range");
                 }
                 py::gil_scoped_release nogil;
                 p.s->eval((int32_t)token);
             },
             py::arg("token"))
        .def("sync",
             [](PySession& p, const py::object& tokens, const py::object& progress) {
                 std::vector<int32_t> toks = to_tokens(tokens);
                 p.cancel.store(false);
                 ds4::Session::ChunkCallback cb = [&p, &progress](int64_t done, int64_t total) {
                     py::gil_scoped_acquire gil;
                     if (PyErr_CheckSignals() != 0) throw py::error_already_set();
                     if (!progress.is_none()) progress(done, total);
                     if (p.cancel.load()) {
                         p.cancel.store(false);
                         ds4::fail(ds4::ErrorKind::Cancelled, "prefill cancelled after " + std::to_string(done) + " of " +
                                                                  std::to_string(total) + " tokens");
                     }
                 };
                 py::gil_scoped_release nogil;
                 p.s->sync(toks, cb);
             },
             py::arg("tokens"), py::arg("progress") = py::none())
        .def("cancel", [](PySession& p) { p.cancel.store(true); })
        .def("rewind", [](PySession& p, int64_t pos) { p.s->rewind(pos); }, py::arg("pos"))
        .def("reset", [](PySession& p) { p.s->reset(); })
        .def("common_prefix", [](PySession& p, const py::object& t) { return p.s->common_prefix(to_tokens(t)); })
        .def("save_payload",
             [](PySession& p) {
                 std::vector<uint8_t> out;
                 {
                     py::gil_scoped_release nogil;
                     out = p.s->save_payload();
                 }
                 return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
             })
        .def("load_payload",
             [](PySession& p, const py::buffer& data) {
                 py::buffer_info info = data.request();
                 const uint8_t* ptr = static_cast<const uint8_t*>(info.ptr);
                 const size_t n = (size_t)(info.size * info.itemsize);
                 py::gil_scoped_release nogil;
                 p.s->load_payload(ptr, n);
             },
             py::arg("data"))
        .def("payload_size", [](PySession& p) { return p.s->payload_size(); })
        .def_property_readonly("kv_bytes", [](PySession& p) { return p.s->kv_allocated_bytes(); })
        .def("mtp_logits",
             [](PySession& p) {
                 std::vector<float> out;
                 {
                     py::gil_scoped_release nogil;
                     const float* l = p.s->mtp_logits();
                     out.assign(l, l + p.s->model().shape().n_vocab);
                 }
                 return py::array_t<float>((py::ssize_t)out.size(), out.data());
             })
        .def("set_steering",
             [](PySession& p, std::shared_ptr<const ds4::Steering> steering) { p.s->set_steering(std::move(steering)); },
             py::arg("steering").none(true))
        .def("set_tap",
             [](PySession& p, int points, bool last_only) {
                 ds4::ActivationTap& t = p.s->tap();
                 if (points < 0 || points >= (1 << ds4::kHookPoints)) {
                     ds4::fail(ds4::ErrorKind::InvalidArgument, "tap points mask " + std::to_string(points) + " is invalid");
                 }
                 t.clear();
                 t.points = points;
                 t.last_only = last_only;
             },
             py::arg("points"), py::arg("last_only") = false)
        .def("take_tap",
             // (positions int64[n], {point: float32[n, n_layer, n_embd]}); the tap is emptied.
             [](PySession& p) {
                 ds4::ActivationTap& t = p.s->tap();
                 const py::ssize_t n = (py::ssize_t)t.positions.size();
                 py::array_t<int64_t> pos(n, t.positions.data());
                 py::dict rows;
                 for (int k = 0; k < ds4::kHookPoints; ++k) {
                     if (!(t.points & (1 << k))) continue;
                     py::array_t<float> a({n, (py::ssize_t)t.n_layer, (py::ssize_t)t.n_embd});
                     if (n > 0) std::memcpy(a.mutable_data(), t.rows[k].data(), (size_t)a.size() * sizeof(float));
                     rows[py::int_(k)] = a;
                 }
                 t.clear();
                 return py::make_tuple(pos, rows);
             })
        .def("max_verify", [](PySession& p) { return p.s->max_verify(); })
        .def("verify",
             [](PySession& p, const py::object& tokens) {
                 std::vector<int32_t> toks = to_tokens(tokens);
                 const int64_t V = p.s->model().shape().n_vocab;
                 py::array_t<float> out({(int64_t)toks.size(), V});
                 float* o = out.mutable_data();
                 {
                     py::gil_scoped_release nogil;
                     p.s->verify(toks.data(), (int64_t)toks.size());
                     for (size_t i = 0; i < toks.size(); ++i) std::copy_n(p.s->verify_logits((int64_t)i), V, o + i * V);
                 }
                 return out;
             },
             py::arg("tokens"))
        .def("accept",
             [](PySession& p, int64_t c) {
                 py::gil_scoped_release nogil;
                 p.s->accept(c);
             },
             py::arg("count"))
        .def("speculate_greedy",
             [](PySession& p, long long first, const py::object& drafts) {
                 if (first < INT32_MIN || first > INT32_MAX) {
                     ds4::fail(ds4::ErrorKind::InvalidArgument, "token id " + std::to_string(first) + " is out of range");
                 }
                 std::vector<int32_t> d = to_tokens(drafts);
                 py::gil_scoped_release nogil;
                 return p.s->speculate_greedy((int32_t)first, d.data(), (int64_t)d.size());
             },
             py::arg("first"), py::arg("drafts"))
        .def("mtp_drafts",
             [](PySession& p, long long first, int64_t n, long long stop) {
                 if (first < INT32_MIN || first > INT32_MAX) {
                     ds4::fail(ds4::ErrorKind::InvalidArgument, "token id " + std::to_string(first) + " is out of range");
                 }
                 const int32_t st = (stop < INT32_MIN || stop > INT32_MAX) ? -1 : (int32_t)stop;
                 py::gil_scoped_release nogil;
                 return p.s->mtp_drafts((int32_t)first, n, st);
             },
             py::arg("first"), py::arg("n"), py::arg("stop") = -1)
        .def("mtp_draft_step",
             [](PySession& p, long long token) {
                 if (token < INT32_MIN || token > INT32_MAX) {
                     ds4::fail(ds4::ErrorKind::InvalidArgument, "token id " + std::to_string(token) + " is out of range");
                 }
                 const int64_t V = p.s->model().shape().n_vocab;
                 py::array_t<float> out(V);
                 float* o = out.mutable_data();
                 {
                     py::gil_scoped_release nogil;
                     std::copy_n(p.s->mtp_draft_step((int32_t)token), V, o);
                 }
                 return out;
             },
             py::arg("token"))
        .def("last_hidden", [](PySession& p) {
            const int64_t n = p.s->model().shape().hc_dim();
            return py::array_t<float>({n}, {(int64_t)sizeof(float)}, p.s->last_hidden());
        });
}
