#include "launcher/hwloc_library.h"

#include <dlfcn.h>
#include <hwloc.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace cpprun::launcher {
namespace {

// Every hwloc function cpprun calls, by name, with hwloc.h's own type. The list is what the
// linker asks for: node_topology.cc's calls and those of the hwloc.h inline helpers it uses
// (hwloc_get_next_obj_by_type, hwloc_get_next_pcidev, hwloc_get_next_osdev,
// hwloc_get_non_io_ancestor_obj). A call missing here is a link error, not a crash.
#define CPPRUN_HWLOC_FUNCTIONS(X)       \
  X(hwloc_get_api_version)              \
  X(hwloc_topology_init)                \
  X(hwloc_topology_destroy)             \
  X(hwloc_topology_load)                \
  X(hwloc_topology_set_xml)             \
  X(hwloc_topology_set_components)      \
  X(hwloc_topology_set_io_types_filter) \
  X(hwloc_topology_is_thissystem)       \
  X(hwloc_get_type_depth)               \
  X(hwloc_get_obj_by_depth)             \
  X(hwloc_obj_type_is_dcache)           \
  X(hwloc_bitmap_first)                 \
  X(hwloc_bitmap_next)                  \
  X(hwloc_bitmap_isset)                 \
  X(hwloc_bitmap_weight)

struct HwlocFunctions {
#define CPPRUN_HWLOC_POINTER(name) decltype(&::name) name = nullptr;
  CPPRUN_HWLOC_FUNCTIONS(CPPRUN_HWLOC_POINTER)
#undef CPPRUN_HWLOC_POINTER
};

// Written once, under loadMutex(), before `loaded` is set (release); read after it is seen.
HwlocFunctions functions;
std::atomic<bool> loaded{false};

std::mutex& loadMutex() {
  static std::mutex mu;
  return mu;
}

const char* const kPackages =
    "install hwloc 2 (Debian/Ubuntu: libhwloc15; RHEL/Rocky/Alma: hwloc-libs; SUSE: libhwloc15; "
    "conda: hwloc), or run without --numa-binding";

Status loadFrom(const std::string& library) {
  // RTLD_GLOBAL: hwloc's plugins find the core's symbols in the global namespace.
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_GLOBAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return Status(StatusCode::kNotFound, "cpprun reads this node's topology with hwloc, and " +
                                             library + " does not load (" +
                                             (why != nullptr ? why : "unknown error") +
                                             "): " + kPackages);
  }
  HwlocFunctions found;
#define CPPRUN_HWLOC_RESOLVE(name)                                                               \
  found.name = reinterpret_cast<decltype(&::name)>(::dlsym(handle, #name));                      \
  if (found.name == nullptr) {                                                                   \
    return Status(StatusCode::kNotFound,                                                         \
                  library + " lacks " #name " (cpprun needs hwloc 2.1 or later): " + kPackages); \
  }
  CPPRUN_HWLOC_FUNCTIONS(CPPRUN_HWLOC_RESOLVE)
#undef CPPRUN_HWLOC_RESOLVE
  const unsigned api = found.hwloc_get_api_version();
  if ((api >> 16) != (HWLOC_API_VERSION >> 16)) {
    return Status(StatusCode::kNotFound, library + " is hwloc API " + std::to_string(api >> 16) +
                                             ".x; cpprun needs 2.x: " + kPackages);
  }
  if (!loaded.load(std::memory_order_acquire)) {
    functions = found;
    loaded.store(true, std::memory_order_release);
  }
  return Status::ok();
}

// Every forwarder goes through here: a call before a successful load is a bug in cpprun.
const HwlocFunctions& hwloc() {
  if (!loaded.load(std::memory_order_acquire)) {
    std::fputs("cpprun: internal error: hwloc called before loadHwlocLibrary()\n", stderr);
    std::abort();
  }
  return functions;
}

}  // namespace

Status loadHwlocLibraryFrom(const std::string& library) {
  std::lock_guard<std::mutex> lock(loadMutex());
  return loadFrom(library);
}

Status loadHwlocLibrary() {
  static const Status status = loadHwlocLibraryFrom(kHwlocLibrary);
  return status;
}

std::string loadedHwlocApiVersion() {
  const unsigned api = hwloc().hwloc_get_api_version();
  return std::to_string(api >> 16) + "." + std::to_string((api >> 8) & 0xff);
}

}  // namespace cpprun::launcher

// The forwarders: hwloc's own names and signatures (hwloc.h declares them; a mismatch does not
// compile), each calling the loaded library's function.
using cpprun::launcher::hwloc;  // NOLINT: only for the forwarders below

extern "C" {
unsigned hwloc_get_api_version(void) { return hwloc().hwloc_get_api_version(); }
int hwloc_topology_init(hwloc_topology_t* topologyp) {
  return hwloc().hwloc_topology_init(topologyp);
}
void hwloc_topology_destroy(hwloc_topology_t topology) { hwloc().hwloc_topology_destroy(topology); }
int hwloc_topology_load(hwloc_topology_t topology) { return hwloc().hwloc_topology_load(topology); }
int hwloc_topology_set_xml(hwloc_topology_t topology, const char* xmlpath) {
  return hwloc().hwloc_topology_set_xml(topology, xmlpath);
}
int hwloc_topology_set_components(hwloc_topology_t topology, unsigned long flags,
                                  const char* name) {
  return hwloc().hwloc_topology_set_components(topology, flags, name);
}
int hwloc_topology_set_io_types_filter(hwloc_topology_t topology, enum hwloc_type_filter_e filter) {
  return hwloc().hwloc_topology_set_io_types_filter(topology, filter);
}
int hwloc_topology_is_thissystem(hwloc_topology_t topology) {
  return hwloc().hwloc_topology_is_thissystem(topology);
}
int hwloc_get_type_depth(hwloc_topology_t topology, hwloc_obj_type_t type) {
  return hwloc().hwloc_get_type_depth(topology, type);
}
hwloc_obj_t hwloc_get_obj_by_depth(hwloc_topology_t topology, int depth, unsigned idx) {
  return hwloc().hwloc_get_obj_by_depth(topology, depth, idx);
}
int hwloc_obj_type_is_dcache(hwloc_obj_type_t type) {
  return hwloc().hwloc_obj_type_is_dcache(type);
}
int hwloc_bitmap_first(hwloc_const_bitmap_t bitmap) { return hwloc().hwloc_bitmap_first(bitmap); }
int hwloc_bitmap_next(hwloc_const_bitmap_t bitmap, int prev) {
  return hwloc().hwloc_bitmap_next(bitmap, prev);
}
int hwloc_bitmap_isset(hwloc_const_bitmap_t bitmap, unsigned id) {
  return hwloc().hwloc_bitmap_isset(bitmap, id);
}
int hwloc_bitmap_weight(hwloc_const_bitmap_t bitmap) { return hwloc().hwloc_bitmap_weight(bitmap); }
}
