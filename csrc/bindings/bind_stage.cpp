// ds4._core.StageSession: one pipeline stage's KV state and forward step (see
// session/stage_session.h). Arrays cross by value, so a stage can sit behind a process boundary
// (a Ray actor); the forward call releases the GIL.
//
// A stage is one mutable state and its long calls run without the GIL, so two Python threads
// inside one stage at once would corrupt it: every entry point claims the stage (StageUse) and a
// second caller gets ds4.errors.SessionBusyError instead.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>
#include <string>
#include <unordered_set>

#include "bindings/buffers.h"
#include "common/errors.h"
#include "session/stage_session.h"

namespace py = pybind11;

namespace {

using IntArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// The stages currently inside a call, by address (the binding holds StageSession directly, so the
// claim lives here rather than in a wrapper object).
class StageUse {
public:
    StageUse(const ds4::StageSession& s, const char* what) : s_(&s) {
        std::lock_guard<std::mutex> lock(mu());
        if (!busy().insert(s_).second) {
            ds4::fail(ds4::ErrorKind::Busy, std::string("StageSession.") + what +
                                                ": the stage is in use by another thread (one call at a time)");
        }
    }
    ~StageUse() {
        std::lock_guard<std::mutex> lock(mu());
        busy().erase(s_);
    }
    StageUse(const StageUse&) = delete;
    StageUse& operator=(const StageUse&) = delete;

private:
    static std::mutex& mu() {
        static std::mutex m;
        return m;
    }
    static std::unordered_set<const void*>& busy() {
        static std::unordered_set<const void*> b;
        return b;
    }
    const void* s_;
};

py::bytes to_bytes(const std::vector<uint8_t>& v) {
    return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

}  // namespace

void init_stage(py::module_& m) {
    py::class_<ds4::StageSession, std::shared_ptr<ds4::StageSession>>(m, "StageSession")
        .def(py::init([](std::shared_ptr<ds4::Model> model, int64_t ctx) {
                 return std::make_shared<ds4::StageSession>(model, ctx);
             }),
             py::arg("model"), py::arg("ctx"))
        .def_property_readonly("pos", [](const ds4::StageSession& s) { StageUse u(s, "pos"); return s.pos(); })
        .def_property_readonly("ctx", &ds4::StageSession::ctx)
        .def_property_readonly("tokens", [](const ds4::StageSession& s) { StageUse u(s, "tokens"); return s.tokens(); })
        .def_property_readonly("kv_bytes", &ds4::StageSession::kv_allocated_bytes)
        .def(
            "forward",
            [](ds4::StageSession& self, const IntArray& tokens, int64_t pos0, const py::object& hc_in, bool prefill) {
                StageUse u(self, "forward");
                const int64_t n = tokens.size();
                const int64_t hd = self.model().shape().hc_dim();
                FloatArray hc;
                const float* hc_ptr = nullptr;
                if (!hc_in.is_none()) {
                    hc = hc_in.cast<FloatArray>();
                    if (hc.size() != n * hd) {
                        ds4::fail(ds4::ErrorKind::InvalidArgument,
                                  "HC state holds " + std::to_string(hc.size()) + " floats, a batch of " +
                                      std::to_string(n) + " tokens needs " + std::to_string(n * hd));
                    }
                    hc_ptr = hc.data();
                }
                py::array_t<float> out((py::ssize_t)self.out_floats(n));
                float* dst = out.mutable_data();
                const int32_t* toks = tokens.data();
                {
                    py::gil_scoped_release nogil;
                    self.forward(toks, n, pos0, hc_ptr, dst, prefill);
                }
                return out;
            },
            py::arg("tokens"), py::arg("pos0"), py::arg("hc_in") = py::none(), py::arg("prefill") = false,
            "Append a batch; returns the n x hc_dim HC state (last stage: the last token's logits).")
        .def("reset", [](ds4::StageSession& self) { StageUse u(self, "reset"); self.reset(); })
        .def("save_payload",
             [](const ds4::StageSession& self) {
                 StageUse u(self, "save_payload");
                 std::vector<uint8_t> out;
                 {
                     py::gil_scoped_release nogil;
                     out = self.save_payload();
                 }
                 return to_bytes(out);
             })
        .def(
            "load_payload",
            [](ds4::StageSession& self, const py::buffer& data) {
                StageUse u(self, "load_payload");
                const ds4_bindings::ByteRange bytes = ds4_bindings::contiguous_bytes(data, "stage payload");
                py::gil_scoped_release nogil;
                self.load_payload(bytes.ptr, bytes.size);
            },
            py::arg("data"))
        .def("mtp_logits", [](ds4::StageSession& self) {
            StageUse u(self, "mtp_logits");
            py::array_t<float> out((py::ssize_t)self.model().shape().n_vocab);
            float* dst = out.mutable_data();
            {
                py::gil_scoped_release nogil;
                const float* l = self.mtp_logits();
                std::copy(l, l + self.model().shape().n_vocab, dst);
            }
            return out;
        });
}
