// One exception type for the whole core. Bindings translate it, in one place, into the
// ds4.errors hierarchy; the core itself never calls exit() or prints to stderr.
#pragma once
#include <stdexcept>
#include <string>

namespace ds4 {

enum class ErrorKind {
    InvalidArgument,   // wrong sizes, bad ids, misaligned buffers  -> ds4.errors.InvalidArgumentError
    ModelFormat,       // a model file that does not match what it declares -> ModelFormatError
    Unsupported,       // a valid file or type the core cannot run -> UnsupportedModelError
    ContextOverflow,   // more tokens than the session's context -> ContextOverflowError
    CacheFormat,       // bad session payload / KV cache file -> CacheFormatError
    Cancelled,         // a cancel flag was raised between chunks -> CancelledError
    Io,                // the OS refused a read/write/mmap -> Ds4IOError
    Busy,              // a session entered by a second caller while in use -> SessionBusyError
    Internal,          // a device failed a command (a kernel fault on a GPU or the emulator) -> Ds4Error
};

class Error : public std::runtime_error {
public:
    Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
    ErrorKind kind() const noexcept { return kind_; }

private:
    ErrorKind kind_;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

}  // namespace ds4
