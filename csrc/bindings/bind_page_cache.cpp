// ds4._core page-cache probes (used by ds4.pagecache):
//   page_cache_probe(path) -> (size, resident, huge)      map + fault in + read the map's residency
//   page_cache_recache_huge(path) -> (size, resident, huge)  drop unmapped cached pages, read back
// Both release the GIL: they may read the whole file from disk.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>

#include "model/page_cache.h"

namespace py = pybind11;

namespace {

std::tuple<uint64_t, uint64_t, uint64_t> as_tuple(const ds4::MapResidency& r) { return {r.size, r.resident, r.huge}; }

}  // namespace

void init_page_cache(py::module_& m) {
    m.def(
        "page_cache_probe",
        [](const std::string& path) {
            py::gil_scoped_release nogil;
            return as_tuple(ds4::probe_page_cache(path));
        },
        py::arg("path"));
    m.def(
        "page_cache_recache_huge",
        [](const std::string& path) {
            py::gil_scoped_release nogil;
            return as_tuple(ds4::recache_huge(path));
        },
        py::arg("path"));
}
