# cpprun_set_warnings(target): the project's warning set; -Werror when CPPRUN_WERROR is ON
# (CI turns it on).
option(CPPRUN_WERROR "Treat warnings as errors" OFF)

function(cpprun_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow
    -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wformat=2)
  if(CPPRUN_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
