// Test driver for metal/host/source_bundle.cpp behind a C ABI (ctypes from
// tests/metal_host/test_source_bundle.py). Returned strings are malloc'd; the caller frees them.
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "source_bundle.h"

using namespace ds4::backend::metal;

namespace {

char* dup(const std::string& s) {
    char* p = static_cast<char*>(std::malloc(s.size() + 1));
    std::memcpy(p, s.c_str(), s.size() + 1);
    return p;
}

}  // namespace

extern "C" {

// The file's bundled text, or the error text with *ok = 0.
char* bundle_file(const char* dir, const char* file, int* ok) {
    try {
        *ok = 1;
        return dup(inline_includes(dir, file));
    } catch (const std::exception& e) {
        *ok = 0;
        return dup(e.what());
    }
}

// "name\n" per loaded source, or the error text with *ok = 0.
char* bundle_dir(const char* dir, int* ok) {
    try {
        std::string names;
        for (const MetalSource& s : load_metal_sources(dir)) names += s.file + "\n";
        *ok = 1;
        return dup(names);
    } catch (const std::exception& e) {
        *ok = 0;
        return dup(e.what());
    }
}

void bundle_free(char* p) { std::free(p); }

}  // extern "C"
