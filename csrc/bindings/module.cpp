// The compiled module ds4._core: only wires the per-concept binding files together.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void init_errors(py::module_& m);
void init_quant(py::module_& m);
void init_engine(py::module_& m);
void init_session(py::module_& m);
void init_hooks(py::module_& m);
void init_sampling(py::module_& m);
void init_logprobs(py::module_& m);
void init_stage(py::module_& m);
void init_backend_ops(py::module_& m);
void init_timeline(py::module_& m);
void init_page_cache(py::module_& m);

PYBIND11_MODULE(_core, m) {
    m.doc() = "ds4 compiled core (internal; use the ds4 package API)";
    init_errors(m);
    init_quant(m);
    init_engine(m);
    init_hooks(m);
    init_session(m);
    init_sampling(m);
    init_logprobs(m);
    init_stage(m);
    init_backend_ops(m);
    init_timeline(m);
    init_page_cache(m);
}
