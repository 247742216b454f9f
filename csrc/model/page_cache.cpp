#include "model/page_cache.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "common/errors.h"

namespace ds4 {

MapResidency probe_page_cache(const std::string& path) {
    MappedFile file(path);
    file.populate();
    return file.residency();
}

MapResidency recache_huge(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(ErrorKind::Io, "cannot open model file '" + path + "': " + std::strerror(errno));
#ifdef POSIX_FADV_DONTNEED
    // Advice: the kernel drops what it can (unmapped, clean pages) and keeps the rest.
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
#endif
    ::close(fd);
    return probe_page_cache(path);
}

}  // namespace ds4
