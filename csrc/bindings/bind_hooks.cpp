// ds4._core.Steering: an immutable set of per-layer steering directions plus its two scales,
// shared by every session it is attached to (ds4.steering.Steering wraps it).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "common/errors.h"
#include "engine/layer_hooks.h"

namespace py = pybind11;

void init_hooks(py::module_& m) {
    py::class_<ds4::Steering, std::shared_ptr<ds4::Steering>>(m, "Steering")
        .def(py::init([](py::array_t<float, py::array::c_style | py::array::forcecast> dirs, float attn, float ffn) {
                 if (dirs.ndim() != 2) {
                     ds4::fail(ds4::ErrorKind::InvalidArgument, "steering directions must be a 2-D [n_layer, n_embd] array");
                 }
                 std::vector<float> v(dirs.data(), dirs.data() + dirs.size());
                 return std::make_shared<ds4::Steering>(dirs.shape(0), dirs.shape(1), std::move(v), attn, ffn);
             }),
             py::arg("directions"), py::arg("attn"), py::arg("ffn"))
        .def_property_readonly("n_layer", [](const ds4::Steering& s) { return s.n_layer; })
        .def_property_readonly("n_embd", [](const ds4::Steering& s) { return s.n_embd; })
        .def_property_readonly("attn", [](const ds4::Steering& s) { return s.scale[(int)ds4::HookPoint::AttnOut]; })
        .def_property_readonly("ffn", [](const ds4::Steering& s) { return s.scale[(int)ds4::HookPoint::FfnOut]; });
    m.attr("HOOK_ATTN_OUT") = (int)ds4::HookPoint::AttnOut;
    m.attr("HOOK_FFN_OUT") = (int)ds4::HookPoint::FfnOut;
}
