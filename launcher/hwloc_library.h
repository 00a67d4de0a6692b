// HwlocLibrary: hwloc 2 (libhwloc.so.15), loaded when a topology is first read rather than
// linked. cpprun links nothing a base system may lack, so the wheel runs on any manylinux_2_28
// system; only --numa-binding (and --check's topology line) needs hwloc, and a node without it
// gets one clear error naming the package that provides it (docs/install.md).
//
// How: hwloc_library.cc defines every hwloc function cpprun calls — directly or through the
// inline helpers of hwloc.h — as a forwarder to the symbol resolved from the loaded library, so
// node_topology.cc calls hwloc as written in hwloc's documentation. The forwarders' signatures
// are checked by the compiler against hwloc.h's declarations. A forwarder called before
// loadHwlocLibrary() succeeded aborts (a programming error: callers load first).
//
// The library is loaded RTLD_GLOBAL: hwloc's plugins (hwloc_pci.so: the PCI tree) look the
// core's symbols up in the global namespace and disable themselves when they are not there.
// It stays loaded for the life of the process.
//
// Errors are values: kNotFound when the library does not load or lacks a symbol (hwloc 1.x
// is libhwloc.so.5 and is not loaded), naming the library, dlopen's reason and the package.
// Thread safety: loadHwlocLibrary() may be called from any thread, concurrently; the first call
// loads, later calls return its result.
#pragma once

#include <string>

#include "common/status.h"

namespace cpprun::launcher {

inline constexpr const char* kHwlocLibrary = "libhwloc.so.15";  // hwloc 2.x's ABI

// Loads hwloc once per process; OK when its functions may be called.
Status loadHwlocLibrary();

// Loads `library` in place of kHwlocLibrary (tests: a name that does not exist): its own
// result, not cached; the first library that loads is the one the forwarders call.
Status loadHwlocLibraryFrom(const std::string& library);

// "2.9" for hwloc_get_api_version()'s 0x20900..., the loaded library's API.
std::string loadedHwlocApiVersion();

}  // namespace cpprun::launcher
