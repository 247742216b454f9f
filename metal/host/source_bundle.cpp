#include "source_bundle.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "common/errors.h"

namespace ds4 {
namespace backend {
namespace metal {

namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) fail(ErrorKind::Io, "metal: cannot read kernel source " + p.string());
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// Appends `name` (found in dir) to out with its quoted includes inlined; `seen` holds the headers
// already inlined into this translation unit.
void append_inlined(const fs::path& dir, const std::string& name, const std::string& included_from,
                    std::set<std::string>& seen, std::string& out) {
    static const std::regex include_line(R"re(^\s*#\s*include\s*"([^"]+)"\s*$)re");
    static const std::regex pragma_once(R"(^\s*#\s*pragma\s+once\s*$)");
    const fs::path path = dir / name;
    if (!fs::is_regular_file(path)) {
        fail(ErrorKind::Io, "metal: " + included_from + " includes \"" + name + "\", which is not in " + dir.string());
    }
    std::istringstream in(read_text(path));
    std::string line;
    int number = 0;
    out += "#line 1 \"" + name + "\"\n";
    while (std::getline(in, line)) {
        ++number;
        std::smatch m;
        if (std::regex_match(line, m, include_line)) {
            const std::string header = m[1].str();
            if (seen.insert(header).second) append_inlined(dir, header, name, seen, out);
            out += "#line " + std::to_string(number + 1) + " \"" + name + "\"\n";
        } else if (std::regex_match(line, pragma_once)) {
            out += "\n";
        } else {
            out += line;
            out += "\n";
        }
    }
}

}  // namespace

std::string inline_includes(const std::string& dir, const std::string& file) {
    std::set<std::string> seen;
    std::string out;
    append_inlined(fs::path(dir), file, "the kernel list", seen, out);
    return out;
}

std::vector<MetalSource> load_metal_sources(const std::string& dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) fail(ErrorKind::Io, "metal: kernel source folder " + dir + " does not exist");
    std::vector<std::string> names;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
        if (e.is_regular_file() && e.path().extension() == ".metal") names.push_back(e.path().filename().string());
    }
    if (ec) fail(ErrorKind::Io, "metal: cannot list kernel source folder " + dir + ": " + ec.message());
    if (names.empty()) fail(ErrorKind::Io, "metal: no .metal files in " + dir);
    std::sort(names.begin(), names.end());
    std::vector<MetalSource> out;
    for (const std::string& n : names) out.push_back({n, inline_includes(dir, n)});
    return out;
}

}  // namespace metal
}  // namespace backend
}  // namespace ds4
