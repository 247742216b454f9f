#include "model/mapped_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errors.h"

namespace ds4 {

MappedFile::MappedFile(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(ErrorKind::Io, "cannot open model file '" + path + "': " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        fail(ErrorKind::Io, "cannot stat model file '" + path + "': " + std::strerror(e));
    }
    size_ = (uint64_t)st.st_size;
    if (size_ == 0) {
        ::close(fd);
        fail(ErrorKind::ModelFormat, "model file '" + path + "' is empty");
    }
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) fail(ErrorKind::Io, "cannot mmap model file '" + path + "': " + std::strerror(e));
    data_ = static_cast<const uint8_t*>(p);
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace ds4
