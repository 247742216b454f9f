#include "common/op_timeline.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <utility>

namespace ds4 {
namespace timeline {

namespace {

std::atomic<bool> g_recording{false};
std::mutex g_mu;
std::vector<Event> g_events;  // guarded by g_mu

thread_local bool t_open = false;
thread_local Event t_event;

}  // namespace

bool wanted() {
    static const bool on = [] {
        const char* v = std::getenv("DS4_OP_TIMELINE");
        return v && std::strcmp(v, "1") == 0;
    }();
    return on;
}

bool recording() { return g_recording.load(std::memory_order_relaxed); }
void set_recording(bool on) { g_recording.store(on, std::memory_order_relaxed); }

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int64_t thread_cpu_ns() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void open(const char* op, const std::string* label, int64_t bytes) {
    t_event = Event{};
    t_event.op = op;
    if (label) t_event.label = *label;
    t_event.bytes = bytes;
    t_open = true;
    t_event.cpu_ns = thread_cpu_ns();
    t_event.t0 = now_ns();
}

void close() {
    if (!t_open) return;
    t_event.t1 = now_ns();
    t_event.cpu_ns = thread_cpu_ns() - t_event.cpu_ns;
    t_open = false;
    std::lock_guard<std::mutex> lk(g_mu);
    g_events.push_back(std::move(t_event));
}

bool has_open() { return t_open; }

void add_handoff(int64_t wake_ns, int64_t tail_ns, int64_t helper_ns, int64_t helper_cpu_ns, bool helper_joined) {
    if (!t_open) return;
    ++t_event.handoffs;
    if (!helper_joined) ++t_event.no_helper;
    t_event.wake_ns += wake_ns;
    t_event.tail_ns += tail_ns;
    t_event.helper_ns += helper_ns;
    t_event.helper_cpu_ns += helper_cpu_ns;
}

std::vector<Event> take() {
    std::lock_guard<std::mutex> lk(g_mu);
    std::vector<Event> out;
    out.swap(g_events);
    return out;
}

}  // namespace timeline
}  // namespace ds4
