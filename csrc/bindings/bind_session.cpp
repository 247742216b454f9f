// ds4._core.Session: one inference timeline. Long calls release the GIL; between prefill chunks
// they take it back to run the progress callback and check for signals / a cancel request, and
// between layers (at most every kSignalPollSeconds) to check for signals, so Ctrl-C lands during
// one long chunk too.
//
// A session is one mutable state: two threads inside it at once would corrupt the heap, because
// the GIL is released during every long call. Each entry point therefore claims the session
// (SessionUse below); a second caller gets ds4.errors.SessionBusyError instead of a crash. The
// progress callback runs on the owning thread while the state is consistent, so it may call the
// read-only methods (pos, tokens, save_payload...) but nothing that changes the state.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <cstring>

#include "bindings/buffers.h"
#include "common/errors.h"
#include "engine/cancel.h"
#include "session/session.h"

namespace py = pybind11;

namespace {

struct PySession {
    std::shared_ptr<ds4::Session> s;
    std::atomic<bool> cancel{false};
    std::atomic<bool> busy{false};
    std::thread::id owner;          // the thread inside the session while busy
    bool in_callback = false;       // the owner is running the progress callback (state consistent)
};

// Claims a session for one call. Every entry point runs with the GIL held, so the check and the
// claim cannot interleave with another Python thread's; the atomic keeps it honest regardless.
class SessionUse {
public:
    enum Mode { Mutating, ReadOnly };
    SessionUse(PySession& p, const char* what, Mode mode) : p_(p) {
        if (p.busy.load()) {
            if (mode == ReadOnly && p.in_callback && p.owner == std::this_thread::get_id()) return;  // re-entrant read
            const bool here = p.owner == std::this_thread::get_id();
            ds4::fail(ds4::ErrorKind::Busy,
                      std::string("Session.") + what + ": " +
                          (here ? "the session is inside its own sync (only read-only calls are allowed from the "
                                  "progress callback)"
                                : "the session is in use by another thread; a session serves one call at a time "
                                  "(use one session per thread)"));
        }
        bool expected = false;
        if (!p.busy.compare_exchange_strong(expected, true)) {
            ds4::fail(ds4::ErrorKind::Busy, std::string("Session.") + what + ": the session is in use by another thread");
        }
        p.owner = std::this_thread::get_id();
        claimed_ = true;
    }
    ~SessionUse() {
        if (!claimed_) return;
        p_.owner = std::thread::id();
        p_.busy.store(false);
    }
    SessionUse(const SessionUse&) = delete;
    SessionUse& operator=(const SessionUse&) = delete;

private:
    PySession& p_;
    bool claimed_ = false;
};

// Marks the owner as inside the progress callback for its duration.
struct InCallback {
    explicit InCallback(PySession& p) : p_(p) { p_.in_callback = true; }
    ~InCallback() { p_.in_callback = false; }
    PySession& p_;
};

// A token id from any Python object: exact integers only (bool and integral numpy scalars count;
// 1.9 or "3" do not), range-checked before narrowing so 2**63 is an error, not an overflow.
int32_t to_token(const py::handle& h, size_t index, bool in_list) {
    const std::string where = in_list ? " at index " + std::to_string(index) : std::string();
    if (!PyIndex_Check(h.ptr()) || PyFloat_Check(h.ptr())) {
        ds4::fail(ds4::ErrorKind::InvalidArgument, "token" + where + " must be an integer, got " +
                                                       std::string(py::str(py::type::of(h).attr("__name__"))) + " " +
                                                       std::string(py::repr(h)));
    }
    py::int_ v = py::reinterpret_steal<py::int_>(PyNumber_Index(h.ptr()));
    if (!v) throw py::error_already_set();
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0 || x < INT32_MIN || x > INT32_MAX) {
        ds4::fail(ds4::ErrorKind::InvalidArgument, "token id " + std::string(py::str(v)) + where + " is out of range");
    }
    return (int32_t)x;
}

std::vector<int32_t> to_tokens(const py::handle& obj) {
    if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()) || !py::isinstance<py::iterable>(obj)) {
        ds4::fail(ds4::ErrorKind::InvalidArgument, "tokens must be a sequence of integer ids, got " +
                                                       std::string(py::str(py::type::of(obj).attr("__name__"))));
    }
    std::vector<int32_t> out;
    size_t i = 0;
    for (const py::handle& h : obj) out.push_back(to_token(h, i++, true));
    return out;
}

// An integer position/size argument (rewind): exact integers, range-checked before narrowing.
int64_t to_index(const py::handle& h, const char* what) {
    if (!PyIndex_Check(h.ptr()) || PyFloat_Check(h.ptr())) {
        ds4::fail(ds4::ErrorKind::InvalidArgument, std::string(what) + " must be an integer, got " + std::string(py::repr(h)));
    }
    py::int_ v = py::reinterpret_steal<py::int_>(PyNumber_Index(h.ptr()));
    if (!v) throw py::error_already_set();
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0) ds4::fail(ds4::ErrorKind::InvalidArgument, std::string(what) + " " + std::string(py::str(v)) + " is out of range");
    return (int64_t)x;
}

// Between layers the core polls this (without the GIL). Every kSignalPollSeconds it takes the GIL
// to let Python run its signal handlers: Ctrl-C then raises KeyboardInterrupt inside the chunk.
constexpr double kSignalPollSeconds = 0.05;

class SignalPoll {
public:
    explicit SignalPoll(PySession& p) : p_(p), last_(std::chrono::steady_clock::now()) {}
    void operator()() {
        if (p_.cancel.load()) {
            p_.cancel.store(false);
            ds4::fail(ds4::ErrorKind::Cancelled, "prefill cancelled inside a chunk");
        }
        const auto now = std::chrono::steady_clock::now();
        if (std::chrono::duration<double>(now - last_).count() < kSignalPollSeconds) return;
        last_ = now;
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }

private:
    PySession& p_;
    std::chrono::steady_clock::time_point last_;
};

}  // namespace

void init_session(py::module_& m) {
    using Use = SessionUse;
    py::class_<PySession, std::shared_ptr<PySession>>(m, "Session")
        .def(py::init([](std::shared_ptr<ds4::Model> model, const py::object& ctx) {
                 auto p = std::make_shared<PySession>();
                 const int64_t n = to_index(ctx, "ctx");
                 py::gil_scoped_release nogil;
                 p->s = std::make_shared<ds4::Session>(model, n);
                 return p;
             }),
             py::arg("model"), py::arg("ctx"))
        .def_property_readonly("pos", [](PySession& p) { Use u(p, "pos", Use::ReadOnly); return p.s->pos(); })
        .def_property_readonly("ctx", [](PySession& p) { return p.s->ctx(); })   // fixed at construction
        .def_property_readonly("tokens", [](PySession& p) { Use u(p, "tokens", Use::ReadOnly); return p.s->tokens(); })
        .def_property_readonly("has_logits", [](PySession& p) { Use u(p, "has_logits", Use::ReadOnly); return p.s->has_logits(); })
        .def("logits_view",
             [](py::object self) {
                 PySession& p = self.cast<PySession&>();
                 Use u(p, "logits", Use::Mutating);   // may rebuild a rewound state
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
            Use u(p, "argmax", Use::Mutating);
            py::gil_scoped_release nogil;
            return p.s->argmax();
        })
        .def("eval",
             [](PySession& p, const py::object& token) {
                 const int32_t t = to_token(token, 0, false);
                 Use u(p, "eval", Use::Mutating);
                 py::gil_scoped_release nogil;
                 p.s->eval(t);
             },
             py::arg("token"))
        .def("eval_with_mtp",
             [](PySession& p, const py::object& token) {
                 const int32_t t = to_token(token, 0, false);
                 Use u(p, "eval_with_mtp", Use::Mutating);
                 py::gil_scoped_release nogil;
                 p.s->eval_with_mtp(t);
             },
             py::arg("token"))
        .def("sync",
             [](PySession& p, const py::object& tokens, const py::object& progress) {
                 std::vector<int32_t> toks = to_tokens(tokens);
                 Use u(p, "sync", Use::Mutating);
                 p.cancel.store(false);
                 ds4::Session::ChunkCallback cb = [&p, &progress](int64_t done, int64_t total) {
                     py::gil_scoped_acquire gil;
                     InCallback in(p);
                     if (PyErr_CheckSignals() != 0) throw py::error_already_set();
                     if (!progress.is_none()) progress(done, total);
                     if (p.cancel.load()) {
                         p.cancel.store(false);
                         ds4::fail(ds4::ErrorKind::Cancelled, "prefill cancelled after " + std::to_string(done) + " of " +
                                                                  std::to_string(total) + " tokens");
                     }
                 };
                 SignalPoll poll_state(p);
                 const ds4::CancelPoll poll = [&poll_state] { poll_state(); };
                 py::gil_scoped_release nogil;
                 ds4::ScopedCancelPoll scoped(&poll);
                 p.s->sync(toks, cb);
             },
             py::arg("tokens"), py::arg("progress") = py::none())
        .def("cancel", [](PySession& p) { p.cancel.store(true); })   // from any thread, by design
        .def("rewind",
             [](PySession& p, const py::object& pos) {
                 const int64_t n = to_index(pos, "rewind position");
                 Use u(p, "rewind", Use::Mutating);
                 p.s->rewind(n);
             },
             py::arg("pos"))
        .def("reset", [](PySession& p) { Use u(p, "reset", Use::Mutating); p.s->reset(); })
        .def("common_prefix",
             [](PySession& p, const py::object& t) {
                 std::vector<int32_t> toks = to_tokens(t);
                 Use u(p, "common_prefix", Use::ReadOnly);
                 return p.s->common_prefix(toks);
             })
        .def("save_payload",
             [](PySession& p) {
                 Use u(p, "save_payload", Use::ReadOnly);   // never stale inside a callback: no rebuild
                 std::vector<uint8_t> out;
                 {
                     py::gil_scoped_release nogil;
                     out = p.s->save_payload();
                 }
                 return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
             })
        .def("load_payload",
             [](PySession& p, const py::buffer& data) {
                 const ds4_bindings::ByteRange bytes = ds4_bindings::contiguous_bytes(data, "session payload");
                 Use u(p, "load_payload", Use::Mutating);
                 py::gil_scoped_release nogil;
                 p.s->load_payload(bytes.ptr, bytes.size);
             },
             py::arg("data"))
        .def("payload_size", [](PySession& p) { Use u(p, "payload_size", Use::ReadOnly); return p.s->payload_size(); })
        .def_property_readonly("kv_bytes", [](PySession& p) { Use u(p, "kv_bytes", Use::ReadOnly); return p.s->kv_allocated_bytes(); })
        .def("mtp_logits",
             [](PySession& p) {
                 Use u(p, "mtp_logits", Use::Mutating);
                 std::vector<float> out;
                 {
                     py::gil_scoped_release nogil;
                     const float* l = p.s->mtp_logits();
                     out.assign(l, l + p.s->model().shape().n_vocab);
                 }
                 return py::array_t<float>((py::ssize_t)out.size(), out.data());
             })
        .def("set_steering",
             [](PySession& p, std::shared_ptr<const ds4::Steering> steering) {
                 Use u(p, "set_steering", Use::Mutating);
                 p.s->set_steering(std::move(steering));
             },
             py::arg("steering").none(true))
        .def("set_tap",
             [](PySession& p, int points, bool last_only) {
                 Use u(p, "set_tap", Use::Mutating);
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
                 Use u(p, "take_tap", Use::Mutating);
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
        .def("max_verify", [](PySession& p) { Use u(p, "max_verify", Use::ReadOnly); return p.s->max_verify(); })
        .def("verify",
             [](PySession& p, const py::object& tokens) {
                 std::vector<int32_t> toks = to_tokens(tokens);
                 Use u(p, "verify", Use::Mutating);
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
             [](PySession& p, const py::handle& count) {
                 const int64_t c = to_index(count, "count");
                 Use u(p, "accept", Use::Mutating);
                 py::gil_scoped_release nogil;
                 p.s->accept(c);
             },
             py::arg("count"))
        .def("speculate_greedy",
             [](PySession& p, const py::handle& first_obj, const py::object& drafts) {
                 const int32_t first = to_token(first_obj, 0, false);
                 std::vector<int32_t> d = to_tokens(drafts);
                 Use u(p, "speculate_greedy", Use::Mutating);
                 py::gil_scoped_release nogil;
                 return p.s->speculate_greedy(first, d.data(), (int64_t)d.size());
             },
             py::arg("first"), py::arg("drafts"))
        .def("mtp_drafts",
             [](PySession& p, const py::handle& first_obj, const py::handle& n_obj, long long stop, float min_margin) {
                 const int32_t first = to_token(first_obj, 0, false);
                 const int64_t n = to_index(n_obj, "n");
                 const int32_t st = (stop < INT32_MIN || stop > INT32_MAX) ? -1 : (int32_t)stop;
                 Use u(p, "mtp_drafts", Use::Mutating);
                 py::gil_scoped_release nogil;
                 return p.s->mtp_drafts(first, n, st, min_margin);
             },
             py::arg("first"), py::arg("n"), py::arg("stop") = -1,
             py::arg("min_margin") = -std::numeric_limits<float>::infinity())
        .def("mtp_top",
             [](PySession& p) {
                 Use u(p, "mtp_top", Use::Mutating);
                 py::gil_scoped_release nogil;
                 return p.s->mtp_top();
             })
        .def("mtp_draft_step",
             [](PySession& p, const py::handle& token_obj) {
                 const int32_t token = to_token(token_obj, 0, false);
                 Use u(p, "mtp_draft_step", Use::Mutating);
                 const int64_t V = p.s->model().shape().n_vocab;
                 py::array_t<float> out(V);
                 float* o = out.mutable_data();
                 {
                     py::gil_scoped_release nogil;
                     std::copy_n(p.s->mtp_draft_step(token), V, o);
                 }
                 return out;
             },
             py::arg("token"))
        .def("last_hidden", [](PySession& p) {
            Use u(p, "last_hidden", Use::ReadOnly);
            const int64_t n = p.s->model().shape().hc_dim();
            return py::array_t<float>({n}, {(int64_t)sizeof(float)}, p.s->last_hidden());
        });
}
