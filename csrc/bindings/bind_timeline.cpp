// ds4._core.op_timeline_*: the per-op decode timeline (common/op_timeline.h), for
// bench/decode_timeline.py. Sessions are timed only when DS4_OP_TIMELINE=1 was set before they
// were created.
#include <pybind11/pybind11.h>

#include "common/op_timeline.h"

namespace py = pybind11;

void init_timeline(py::module_& m) {
    m.def("op_timeline_wanted", &ds4::timeline::wanted, "DS4_OP_TIMELINE=1 was set: new sessions are timed");
    m.def("op_timeline_record", &ds4::timeline::set_recording, py::arg("on"),
          "Start or stop recording op events of timed sessions");
    m.def("op_timeline_take", [] {
        py::list out;
        for (const auto& e : ds4::timeline::take()) {
            py::dict d;
            d["op"] = e.op;
            d["label"] = e.label;
            d["bytes"] = e.bytes;
            d["t0"] = e.t0;
            d["t1"] = e.t1;
            d["handoffs"] = e.handoffs;
            d["no_helper"] = e.no_helper;
            d["wake_ns"] = e.wake_ns;
            d["tail_ns"] = e.tail_ns;
            d["helper_ns"] = e.helper_ns;
            d["cpu_ns"] = e.cpu_ns;
            d["helper_cpu_ns"] = e.helper_cpu_ns;
            out.append(std::move(d));
        }
        return out;
    }, "The recorded events (dicts, in order) and clear them");
}
