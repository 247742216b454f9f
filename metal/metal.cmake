# Apple only (included from CMakeLists.txt): the Objective-C++ Metal host (metal/host) built into
# the core, the Metal and Foundation frameworks linked, and DS4_HAVE_APPLE_METAL defined so the
# backend registry offers "metal" (docs/metal.md, "The Objective-C++ host"). The .metal sources
# are compiled at load time from the package data (CMakeLists.txt installs them as ds4/metal/).
enable_language(OBJCXX)
set(CMAKE_OBJCXX_STANDARD 17)
set(CMAKE_OBJCXX_STANDARD_REQUIRED ON)
file(GLOB DS4_METAL_HOST_MM CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/metal/host/*.mm)
file(GLOB DS4_METAL_HOST_CPP CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/metal/host/*.cpp)
target_sources(ds4core PRIVATE ${DS4_METAL_HOST_MM} ${DS4_METAL_HOST_CPP})
set_source_files_properties(${DS4_METAL_HOST_MM} PROPERTIES COMPILE_OPTIONS "-fobjc-arc")
target_include_directories(ds4core PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/metal/host)
target_compile_definitions(ds4core PRIVATE DS4_HAVE_APPLE_METAL=1
  # last fallback for the kernel sources: the checkout this build came from (development builds)
  DS4_METAL_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}/metal")
target_link_libraries(ds4core PUBLIC "-framework Metal" "-framework Foundation")
message(STATUS "ds4: Metal backend (Objective-C++ host) built")
