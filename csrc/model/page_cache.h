// The model file in the page cache: whether a decode step will read its weights through 2 MiB
// page-table entries or 4 KiB ones (docs/pagecache.md). Linux-specific where it matters; elsewhere
// both calls map and read the file and report no huge pages.
#pragma once
#include <string>

#include "model/mapped_file.h"

namespace ds4 {

// Maps the file as the engine does, faults in every page (reading from disk what is not cached)
// and reports the map's residency. Throws Io naming the path.
MapResidency probe_page_cache(const std::string& path);

// Drops the file's cached pages that no process maps (clean pages only; nothing is written), then
// reads it back through a map that asks for 2 MiB pages, so the page cache holds it in 2 MiB
// folios where the kernel and file system allow. Pages another process maps stay as they are.
MapResidency recache_huge(const std::string& path);

}  // namespace ds4
