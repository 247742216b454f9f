// A read-only memory map of a model file. Weights are used in place: nothing is copied, so the
// resident size grows only with the pages a forward pass touches.
#pragma once
#include <cstdint>
#include <string>

namespace ds4 {

// How much of a map is in memory, and how much of that the kernel maps with 2 MiB entries.
struct MapResidency {
    uint64_t size = 0;       // the map's length (the file size)
    uint64_t resident = 0;   // bytes of the map backed by page-cache pages (Rss)
    uint64_t huge = 0;       // of those, bytes mapped by 2 MiB entries (FilePmdMapped)
};

class MappedFile {
public:
    explicit MappedFile(const std::string& path);   // throws Io naming the path
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const noexcept { return data_; }
    uint64_t size() const noexcept { return size_; }
    const std::string& path() const noexcept { return path_; }

    // Faults in every page of the map, reading from disk what the page cache lacks.
    void populate() const;
    // This map's residency (Linux: /proc/self/smaps; elsewhere only the size is known).
    MapResidency residency() const;

private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
};

}  // namespace ds4
