# The manylinux_2_28 wheels' cross toolchain (packaging/zig-toolchain.sh copies this file into
# the prefix it makes, beside bin/ with the zig wrappers and the headers and static libraries):
# zig's clang targeting glibc 2.28 with LLVM's libc++ linked statically. Everything is found in
# that prefix only — never the host's headers or libraries, which are glibc 2.36's.
set(CMAKE_SYSTEM_NAME Linux)
file(READ "${CMAKE_CURRENT_LIST_DIR}/bin/zig-c++" _cpprun_zig_wrapper)
string(REGEX MATCH "-target ([a-z0-9_]+)-linux" _cpprun_zig_target "${_cpprun_zig_wrapper}")
set(CMAKE_SYSTEM_PROCESSOR "${CMAKE_MATCH_1}")

set(CMAKE_CXX_COMPILER "${CMAKE_CURRENT_LIST_DIR}/bin/zig-c++")
set(CMAKE_AR "${CMAKE_CURRENT_LIST_DIR}/bin/zig-ar" CACHE FILEPATH "zig ar")
set(CMAKE_RANLIB "${CMAKE_CURRENT_LIST_DIR}/bin/zig-ranlib" CACHE FILEPATH "zig ranlib")
# The wheel's binaries are stripped when linked (cmake/Wheel.cmake): zig's objcopy cannot strip.

set(CMAKE_FIND_ROOT_PATH "${CMAKE_CURRENT_LIST_DIR}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# Boost's headers through CMake's FindBoost (the host's BoostConfig would add /usr/include).
set(Boost_NO_BOOST_CMAKE ON)
set(BOOST_INCLUDEDIR "${CMAKE_CURRENT_LIST_DIR}/include")
set(OPENSSL_ROOT_DIR "${CMAKE_CURRENT_LIST_DIR}")
