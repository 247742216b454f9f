// The single place where ds4::Error crosses into Python, as the ds4.errors hierarchy.
#include <pybind11/pybind11.h>

#include "common/errors.h"

namespace py = pybind11;

void init_errors(py::module_& m) {
    // Look the classes up once, at import; ds4.errors is pure Python and imports nothing else.
    py::module_ errors = py::module_::import("ds4.errors");
    static py::object cls_invalid = errors.attr("InvalidArgumentError");
    static py::object cls_format = errors.attr("ModelFormatError");
    static py::object cls_unsupported = errors.attr("UnsupportedModelError");
    static py::object cls_overflow = errors.attr("ContextOverflowError");
    static py::object cls_cache = errors.attr("CacheFormatError");
    static py::object cls_cancelled = errors.attr("CancelledError");
    static py::object cls_io = errors.attr("Ds4IOError");
    static py::object cls_busy = errors.attr("SessionBusyError");
    static py::object cls_memory = errors.attr("Ds4MemoryError");
    static py::object cls_base = errors.attr("Ds4Error");

    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const ds4::Error& e) {
            PyObject* cls = cls_base.ptr();
            switch (e.kind()) {
                case ds4::ErrorKind::InvalidArgument: cls = cls_invalid.ptr(); break;
                case ds4::ErrorKind::ModelFormat: cls = cls_format.ptr(); break;
                case ds4::ErrorKind::Unsupported: cls = cls_unsupported.ptr(); break;
                case ds4::ErrorKind::ContextOverflow: cls = cls_overflow.ptr(); break;
                case ds4::ErrorKind::CacheFormat: cls = cls_cache.ptr(); break;
                case ds4::ErrorKind::Cancelled: cls = cls_cancelled.ptr(); break;
                case ds4::ErrorKind::Io: cls = cls_io.ptr(); break;
                case ds4::ErrorKind::Busy: cls = cls_busy.ptr(); break;
                case ds4::ErrorKind::Internal: break;   // the base class: no narrower meaning
            }
            PyErr_SetString(cls, e.what());
        } catch (const std::bad_alloc&) {
            PyErr_SetString(cls_memory.ptr(), "ds4 core: out of memory (the context or batch is too large for this machine)");
        }
    });
}
