// A read-only memory map of a model file. Weights are used in place: nothing is copied, so the
// resident size grows only with the pages a forward pass touches.
#pragma once
#include <cstdint>
#include <string>

namespace ds4 {

class MappedFile {
public:
    explicit MappedFile(const std::string& path);   // throws Io naming the path
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const noexcept { return data_; }
    uint64_t size() const noexcept { return size_; }
    const std::string& path() const noexcept { return path_; }

private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
};

}  // namespace ds4
