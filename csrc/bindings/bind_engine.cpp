// Engine / Session bindings (filled in by the engine work).
#include <pybind11/pybind11.h>

namespace py = pybind11;

void init_engine(py::module_& m) { (void)m; }
