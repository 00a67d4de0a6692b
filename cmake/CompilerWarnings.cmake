# cpprun_set_warnings(target): the project's warning set; -Werror when CPPRUN_WERROR is ON
# (CI turns it on).
option(CPPRUN_WERROR "Treat warnings as errors" OFF)
# clang's thread-safety analysis of the CPPRUN_GUARDED_BY / CPPRUN_REQUIRES annotations
# (common/thread_annotations.h), its findings errors: the `thread-safety` preset. GCC ignores it.
option(CPPRUN_THREAD_SAFETY "clang: -Wthread-safety -Werror=thread-safety" OFF)

function(cpprun_set_warnings target)
  # C++ sources only: nvcc has its own warning flags.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic
    -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wformat=2>)
  # A unity build (the main preset) includes each source into a generated one, so GCC sees a
  # class of one source holding a member of an anonymous-namespace type as if it came from a
  # header and warns; in a normal build the same code is fine.
  if(CMAKE_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
  endif()
  if(CPPRUN_THREAD_SAFETY AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety -Werror=thread-safety>)
  endif()
  if(CPPRUN_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
  endif()
endfunction()
