// ds4._core.StageSession: one pipeline stage's KV state and forward step (see
// session/stage_session.h). Arrays cross by value, so a stage can sit behind a process boundary
// (a Ray actor); the forward call releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/buffers.h"
#include "common/errors.h"
#include "session/stage_session.h"

namespace py = pybind11;

namespace {

using IntArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

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
        .def_property_readonly("pos", &ds4::StageSession::pos)
        .def_property_readonly("ctx", &ds4::StageSession::ctx)
        .def_property_readonly("tokens", &ds4::StageSession::tokens)
        .def_property_readonly("kv_bytes", &ds4::StageSession::kv_allocated_bytes)
        .def(
            "forward",
            [](ds4::StageSession& self, const IntArray& tokens, int64_t pos0, const py::object& hc_in, bool prefill) {
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
        .def("reset", &ds4::StageSession::reset)
        .def("save_payload",
             [](const ds4::StageSession& self) {
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
                const ds4_bindings::ByteRange bytes = ds4_bindings::contiguous_bytes(data, "stage payload");
                py::gil_scoped_release nogil;
                self.load_payload(bytes.ptr, bytes.size);
            },
            py::arg("data"))
        .def("mtp_logits", [](ds4::StageSession& self) {
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
