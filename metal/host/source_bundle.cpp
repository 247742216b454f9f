#include "source_bundle.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
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

// The words of a preprocessor line ("#  include \"x.h\"" -> {"include", "\"x.h\""}); empty
// for a line that is not a directive.
std::vector<std::string> directive_words(const std::string& line) {
    std::vector<std::string> words;
    size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line[i] != '#') return words;
    std::istringstream rest(line.substr(i + 1));
    std::string w;
    while (rest >> w) words.push_back(w);
    return words;
}

// Appends `name` (found in dir) to out with its quoted includes inlined; `seen` holds the headers
// already inlined into this translation unit.
void append_inlined(const fs::path& dir, const std::string& name, const std::string& included_from,
                    std::set<std::string>& seen, std::string& out) {
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
        const std::vector<std::string> words = directive_words(line);
        const bool quoted_include = words.size() == 2 && words[0] == "include" && words[1].size() > 2 &&
                                    words[1].front() == '"' && words[1].back() == '"';
        if (quoted_include) {
            const std::string header = words[1].substr(1, words[1].size() - 2);
            if (seen.insert(header).second) append_inlined(dir, header, name, seen, out);
            out += "#line " + std::to_string(number + 1) + " \"" + name + "\"\n";
        } else if (words.size() == 2 && words[0] == "pragma" && words[1] == "once") {
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
