# CPPRUN_SANITIZE=address,undefined (or thread) builds everything with those sanitizers.
set(CPPRUN_SANITIZE "" CACHE STRING "Comma-separated sanitizers: address,undefined or thread")
if(CPPRUN_SANITIZE)
  add_compile_options(-fsanitize=${CPPRUN_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${CPPRUN_SANITIZE})
  if(CPPRUN_SANITIZE MATCHES "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-tsan)  # Asio's atomic_thread_fence, harmless
  endif()
endif()
