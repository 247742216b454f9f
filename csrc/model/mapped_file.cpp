#include "model/mapped_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errors.h"

namespace ds4 {

namespace {

constexpr uint64_t kHugePage = 2ull << 20;

// The map starts on a 2 MiB boundary, so that every 2 MiB of the file the page cache holds as one
// large folio can be mapped by one page-table entry (docs/pagecache.md): a decode step
// streams the weights once, and with 4 KiB entries its TLB misses cost a large share of the read
// bandwidth. The spare address space around the map is given back.
void* map_aligned(int fd, uint64_t size) {
    const uint64_t span = size + kHugePage;
    void* area = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (area == MAP_FAILED) return ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    const uintptr_t base = reinterpret_cast<uintptr_t>(area);
    const uintptr_t start = (base + kHugePage - 1) & ~(uintptr_t)(kHugePage - 1);
    void* p = ::mmap(reinterpret_cast<void*>(start), size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        const int e = errno;
        ::munmap(area, span);
        errno = e;
        return MAP_FAILED;
    }
    const uintptr_t end = start + size, page = (uintptr_t)::sysconf(_SC_PAGESIZE);
    const uintptr_t tail = (end + page - 1) & ~(page - 1);
    if (start > base) ::munmap(area, start - base);
    if (base + span > tail) ::munmap(reinterpret_cast<void*>(tail), base + span - tail);
    return p;
}

// Pages the map faults in from disk come in as 2 MiB folios where the kernel and file system can
// (Linux with transparent huge pages in "madvise" or "always" mode). Advice only: where it is
// refused the map works as before.
void ask_for_huge_pages(void* p, uint64_t size) {
#ifdef MADV_HUGEPAGE
    (void)::madvise(p, size, MADV_HUGEPAGE);
#else
    (void)p;
    (void)size;
#endif
}

}  // namespace

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
    void* p = map_aligned(fd, size_);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) fail(ErrorKind::Io, "cannot mmap model file '" + path + "': " + std::strerror(e));
    data_ = static_cast<const uint8_t*>(p);
    ask_for_huge_pages(p, size_);
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace ds4

namespace ds4 {

void MappedFile::populate() const {
#ifdef MADV_POPULATE_READ
    if (::madvise(const_cast<uint8_t*>(data_), size_, MADV_POPULATE_READ) == 0) return;
#endif
    const uint64_t page = (uint64_t)::sysconf(_SC_PAGESIZE);
    volatile uint8_t sink = 0;
    for (uint64_t off = 0; off < size_; off += page) sink = sink + data_[off];
    (void)sink;
}

MapResidency MappedFile::residency() const {
    MapResidency r;
    r.size = size_;
#ifdef __linux__
    // smaps lists one block per VMA: "start-end perms ..." then "Key: value kB" lines. The map may
    // have been split into several VMAs (by madvise), so every block inside [data_, data_ + size_)
    // counts.
    FILE* f = std::fopen("/proc/self/smaps", "r");
    if (!f) return r;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(data_), hi = lo + size_;
    bool inside = false;
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
        unsigned long start = 0, end = 0;
        unsigned long long kb = 0;
        if (std::sscanf(line, "%lx-%lx ", &start, &end) == 2 && std::strchr(line, '-') < std::strchr(line, ' ')) {
            inside = start >= lo && start < hi;
        } else if (inside && std::sscanf(line, "Rss: %llu kB", &kb) == 1) {
            r.resident += kb << 10;
        } else if (inside && std::sscanf(line, "FilePmdMapped: %llu kB", &kb) == 1) {
            r.huge += kb << 10;
        }
    }
    std::fclose(f);
#endif
    return r;
}

}  // namespace ds4
