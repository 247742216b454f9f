// ds4._core.Model: a loaded model (mapped weights + thread pool), built from the shape dict and
// tensor table that ds4.inspect produced. The Python ds4.Engine wraps it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "backend/metal/emu_device.h"
#include "common/errors.h"
#include "engine/model.h"
#include "layers/indexer.h"

namespace py = pybind11;

namespace {

template <class T>
T get_field(const py::dict& d, const char* key) {
    if (!d.contains(key)) ds4::fail(ds4::ErrorKind::InvalidArgument, std::string("shape dict lacks '") + key + "'");
    return d[key].cast<T>();
}

ds4::Shape shape_from_dict(const py::dict& d) {
    ds4::Shape s;
    s.n_layer = get_field<int>(d, "n_layer");
    s.n_embd = get_field<int>(d, "n_embd");
    s.n_vocab = get_field<int>(d, "n_vocab");
    s.n_head = get_field<int>(d, "n_head");
    s.n_head_kv = get_field<int>(d, "n_head_kv");
    s.head_dim = get_field<int>(d, "head_dim");
    s.n_rot = get_field<int>(d, "n_rot");
    s.n_out_group = get_field<int>(d, "n_out_group");
    s.q_lora_rank = get_field<int>(d, "q_lora_rank");
    s.o_lora_rank = get_field<int>(d, "o_lora_rank");
    s.n_expert = get_field<int>(d, "n_expert");
    s.n_expert_used = get_field<int>(d, "n_expert_used");
    s.n_expert_shared = get_field<int>(d, "n_expert_shared");
    s.n_ff_exp = get_field<int>(d, "n_ff_exp");
    s.n_hash_layer = get_field<int>(d, "n_hash_layer");
    s.n_swa = get_field<int>(d, "n_swa");
    s.indexer_heads = get_field<int>(d, "indexer_heads");
    s.indexer_head_dim = get_field<int>(d, "indexer_head_dim");
    s.indexer_top_k = get_field<int>(d, "indexer_top_k");
    s.n_hc = get_field<int>(d, "n_hc");
    s.sinkhorn_iters = get_field<int>(d, "sinkhorn_iters");
    s.compress_ratios = get_field<std::vector<int>>(d, "compress_ratios");
    s.rms_eps = get_field<float>(d, "rms_eps");
    s.hc_eps = get_field<float>(d, "hc_eps");
    s.expert_weights_scale = get_field<float>(d, "expert_weights_scale");
    s.swiglu_clamp = get_field<float>(d, "swiglu_clamp");
    s.rope_freq_base = get_field<float>(d, "rope_freq_base");
    s.rope_scale_factor = get_field<float>(d, "rope_scale_factor");
    s.yarn_beta_fast = get_field<float>(d, "yarn_beta_fast");
    s.yarn_beta_slow = get_field<float>(d, "yarn_beta_slow");
    s.rope_orig_ctx = get_field<int64_t>(d, "rope_orig_ctx");
    s.compress_rope_freq_base = get_field<float>(d, "compress_rope_freq_base");
    return s;
}

std::vector<ds4::TensorDesc> tensors_from_list(const py::list& lst) {
    std::vector<ds4::TensorDesc> out;
    out.reserve(lst.size());
    for (const py::handle& h : lst) {
        py::tuple t = h.cast<py::tuple>();
        if (t.size() != 5) ds4::fail(ds4::ErrorKind::InvalidArgument, "tensor entries are (name, type, dims, offset, nbytes)");
        ds4::TensorDesc d;
        d.name = t[0].cast<std::string>();
        d.type = t[1].cast<uint32_t>();
        d.dims = t[2].cast<std::vector<int64_t>>();
        d.offset = t[3].cast<uint64_t>();
        d.nbytes = t[4].cast<uint64_t>();
        out.push_back(std::move(d));
    }
    return out;
}

}  // namespace

void init_engine(py::module_& m) {
    py::class_<ds4::Model, std::shared_ptr<ds4::Model>>(m, "Model")
        .def(py::init([](const std::string& path, const py::dict& shape, const py::list& tensors, int threads,
                         int64_t prefill_chunk, int layer_begin, int layer_end, const std::string& backend) {
                 ds4::ModelOptions o;
                 o.threads = threads;
                 o.prefill_chunk = prefill_chunk;
                 o.layer_begin = layer_begin;
                 o.layer_end = layer_end;
                 o.backend = backend;
                 ds4::Shape s = shape_from_dict(shape);
                 std::vector<ds4::TensorDesc> descs = tensors_from_list(tensors);
                 py::gil_scoped_release nogil;
                 return std::make_shared<ds4::Model>(path, s, descs, o);
             }),
             py::arg("path"), py::arg("shape"), py::arg("tensors"), py::arg("threads") = 0,
             py::arg("prefill_chunk") = 0, py::arg("layer_begin") = 0, py::arg("layer_end") = 0,
             py::arg("backend") = "auto")
        .def("load_mtp",
             [](ds4::Model& self, const std::string& path, const py::list& tensors) {
                 self.load_mtp(path, tensors_from_list(tensors));
             },
             py::arg("path"), py::arg("tensors"))
        .def_property_readonly("threads", &ds4::Model::threads)
        .def_property_readonly("layer_begin", &ds4::Model::layer_begin)
        .def_property_readonly("layer_end", &ds4::Model::layer_end)
        .def_property_readonly("backend", [](const ds4::Model& self) { return std::string(self.backend().name()); })
        .def_property("prefill_chunk", &ds4::Model::prefill_chunk, &ds4::Model::set_prefill_chunk)
        .def_property_readonly("has_mtp", [](const ds4::Model& self) { return self.weights().mtp.present; })
        .def_property_readonly("routed_bits", [](const ds4::Model& self) { return self.weights().routed_bits; })
        .def_property_readonly("file_bytes", &ds4::Model::file_bytes)
        .def_property_readonly("decode_weight_bytes", &ds4::Model::decode_weight_bytes)
        .def("chunk_for", &ds4::Model::chunk_for);

    // The backend registry: (name, available, reason) in "auto" preference order.
    m.def("available_backends", [] {
        std::vector<std::tuple<std::string, bool, std::string>> out;
        for (const ds4::backend::BackendInfo& b : ds4::backend::available_backends()) out.emplace_back(b.name, b.available, b.reason);
        return out;
    });

    // Internal: loads the Metal emulator library ds4.metal_emu built (the metal-emu backend).
    m.def("set_metal_emu_library", [](const std::string& path) { ds4::backend::metal::load_emu_library(path); });
    m.def("metal_emu_library", [] { return ds4::backend::metal::emu_library_path(); });

    // Internal, for tests: the indexer's top-k selection over a score vector.
    m.def("_select_top_k", [](py::array_t<float, py::array::c_style | py::array::forcecast> scores, int64_t k) {
        const int64_t n = scores.size();
        std::vector<int32_t> order((size_t)n + 1);
        py::array_t<uint8_t> out(n);
        ds4::select_top_k(scores.data(), n, k, order.data(), out.mutable_data());
        return out;
    });
}
