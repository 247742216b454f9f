// The .metal sources as Metal's runtime compiler takes them: newLibraryWithSource has no include
// path, so each kernel file's quoted #includes are replaced by the header text (once per file,
// as #pragma once would), with #line markers so compiler messages name the real file and line.
// Pure C++: unit-tested on Linux (tests/metal_host/test_source_bundle.py).
#pragma once
#include <string>
#include <vector>

namespace ds4 {
namespace backend {
namespace metal {

struct MetalSource {
    std::string file;   // the .metal file name ("matvec.metal")
    std::string text;   // its text with every quoted include inlined
};

// Every *.metal file directly in `dir`, sorted by name. Throws ds4 Io errors naming the folder
// or file that is missing or unreadable, and a quoted include that is not found in `dir`.
std::vector<MetalSource> load_metal_sources(const std::string& dir);

// One file's text with its quoted includes (found in `dir`) inlined once each.
std::string inline_includes(const std::string& dir, const std::string& file);

}  // namespace metal
}  // namespace backend
}  // namespace ds4
