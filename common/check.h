// CPPRUN_CHECK: aborts on a broken internal invariant, naming the condition and the place.
//
// Never use it for network bytes, files, flags or anything else that comes from outside the
// process: those get a Status or an exception at the module boundary instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#define CPPRUN_CHECK(cond)                                                                  \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "cpprun: invariant violated at %s:%d: %s\n", __FILE__, __LINE__, \
                   #cond);                                                                  \
      std::abort();                                                                         \
    }                                                                                       \
  } while (false)
