// A Stream that forwards every call to another one and, while the op timeline records
// (common/op_timeline.h), brackets each op with a timeline event: wall time on the calling
// thread, weight bytes read, and the thread pool's hand-offs inside it. Meaningful for the CPU
// backend, whose ops run synchronously; a GPU stream only queues work inside an op.
#pragma once
#include <memory>

#include "backend/backend.h"

namespace ds4 {
namespace backend {

// Returns `inner` unchanged unless DS4_OP_TIMELINE=1 (timeline::wanted()).
std::unique_ptr<Stream> maybe_timed(std::unique_ptr<Stream> inner);

}  // namespace backend
}  // namespace ds4
