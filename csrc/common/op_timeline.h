// A per-op wall-clock timeline of the forward pass, for finding the time a decode step spends
// outside weight streaming (docs/kernels.md "Where a decode step's wall time goes").
//
// Off unless DS4_OP_TIMELINE=1 is set when a session creates its stream: only then is the stream
// wrapped in a timing layer (backend/timed_stream.h), so ordinary runs pay nothing. Recording
// itself is switched on and off with set_recording() (ds4._core.op_timeline_record) so a bench
// can time decode steps alone; take() hands the events over and clears them.
//
// Each event is one Stream op on the calling thread: its begin and end (steady clock, ns), the
// weight bytes it reads, and what the thread pool did inside it: how many parallel_for calls
// handed ranges to other threads, how long the first helper took to start (wake), how long the
// caller then waited for the helpers after finishing its own ranges (tail), and the helpers'
// busy time. Only the thread that opened an event adds to it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ds4 {
namespace timeline {

struct Event {
    const char* op = nullptr;       // the Stream method's name (static string)
    std::string label;              // the first weight's tensor name, "" for weightless ops
    int64_t bytes = 0;              // weight bytes the op reads
    int64_t t0 = 0, t1 = 0;         // steady clock, ns
    int32_t handoffs = 0;           // parallel_for calls that woke other threads
    int32_t no_helper = 0;          // of those, calls the caller finished before any helper joined
    int64_t wake_ns = 0;            // sum over handoffs: publish -> first helper starts a range
    int64_t tail_ns = 0;            // sum over handoffs: caller's own ranges done -> job complete
    int64_t helper_ns = 0;          // sum of helper threads' time inside the job
    int64_t cpu_ns = 0;             // the calling thread's CPU time in the op
    int64_t helper_cpu_ns = 0;      // the helpers' CPU time inside the op's jobs
};

bool wanted();                      // DS4_OP_TIMELINE=1 in the environment (read once)
bool recording();                   // cheap: an atomic load
void set_recording(bool on);
int64_t now_ns();
int64_t thread_cpu_ns();             // this thread's CPU time (a system call: timed runs only)

// The calling thread opens an event, the pool adds hand-off figures to the thread's open event,
// and close() appends it to the process-wide list.
void open(const char* op, const std::string* label, int64_t bytes);
void close();
bool has_open();                    // this thread has an event open (the pool's cheap check)
void add_handoff(int64_t wake_ns, int64_t tail_ns, int64_t helper_ns, int64_t helper_cpu_ns, bool helper_joined);

std::vector<Event> take();

}  // namespace timeline
}  // namespace ds4
