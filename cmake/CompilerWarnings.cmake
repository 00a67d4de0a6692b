# cpprun_set_warnings(target): the project's warning set; -Werror when CPPRUN_WERROR is ON
# (CI turns it on).
option(CPPRUN_WERROR "Treat warnings as errors" OFF)

function(cpprun_set_warnings target)
  # C++ sources only: nvcc has its own warning flags.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic
    -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wformat=2>)
  if(CPPRUN_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
  endif()
endfunction()
