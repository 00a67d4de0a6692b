// A shared library named libnccl.so.2 that is not NCCL: it loads, but has none of NCCL's entry
// points (tests/CMakeLists.txt builds it as not-nccl/libnccl.so.2), for the path where the
// library found is the wrong one.
extern "C" __attribute__((visibility("default"))) int cpprunNotNccl(void) { return 0; }
