// A cooperative cancellation point for long core calls. The caller of a long computation (the
// Python binding, around a prefill) installs a poll for its thread; the forward pass calls
// poll_cancel() between layers and token groups, always on the calling thread and outside any
// parallel region, so the poll may throw (ds4::Error Cancelled, or a Python exception) and the
// exception unwinds like any other failure inside a chunk (the session rebuilds from its last
// consistent checkpoint). With no poll installed it costs one thread-local load.
#pragma once
#include <functional>

namespace ds4 {

using CancelPoll = std::function<void()>;

namespace detail {
inline thread_local const CancelPoll* current_cancel_poll = nullptr;
}

// Installs `poll` for the calling thread for this object's lifetime (nesting restores the outer one).
class ScopedCancelPoll {
public:
    explicit ScopedCancelPoll(const CancelPoll* poll) : prev_(detail::current_cancel_poll) {
        detail::current_cancel_poll = poll;
    }
    ~ScopedCancelPoll() { detail::current_cancel_poll = prev_; }
    ScopedCancelPoll(const ScopedCancelPoll&) = delete;
    ScopedCancelPoll& operator=(const ScopedCancelPoll&) = delete;

private:
    const CancelPoll* prev_;
};

inline void poll_cancel() {
    if (const CancelPoll* p = detail::current_cancel_poll) (*p)();
}

}  // namespace ds4
