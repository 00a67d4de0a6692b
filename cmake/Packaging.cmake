# What `cmake --install` puts under the prefix, and the .deb CPack makes of it:
#   bin/cpprun, bin/cpprun-store, bin/cpprun-mnist
#   share/man/man1/cpprun.1                   generated from `cpprun --help` by help2man
#   share/bash-completion/completions/cpprun
#   share/modulefiles/cpprun/<version>        Environment Modules / Lmod (Tcl), relocatable
#   share/cpprun/mnist/                       the shipped digits cpprun-mnist trains on
#   share/doc/cpprun/                         README, docs/, examples/ (scripts and recipes)
# `cpack --config build/CPackConfig.cmake -G DEB` builds cpprun_<version>_<arch>.deb with its
# dependencies computed by dpkg-shlibdeps.
include(GNUInstallDirs)

install(TARGETS cpprun cpprun-store cpprun-mnist RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

find_program(CPPRUN_HELP2MAN help2man)
if(CPPRUN_HELP2MAN)
  add_custom_command(
    OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/cpprun.1
    COMMAND ${CPPRUN_HELP2MAN} --no-info --no-discard-stderr
            --name "torchrun-style launcher for GPU clusters"
            --output ${CMAKE_CURRENT_BINARY_DIR}/cpprun.1 $<TARGET_FILE:cpprun>
    DEPENDS cpprun
    COMMENT "Generating the cpprun(1) man page from --help")
  add_custom_target(cpprun-man ALL DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/cpprun.1)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/cpprun.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
else()
  message(WARNING "help2man not found (packaging/setup.sh without --build-only installs it): no cpprun(1) man page")
endif()

install(FILES packaging/completion/cpprun.bash
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME cpprun)
configure_file(packaging/modulefiles/cpprun.in
               ${CMAKE_CURRENT_BINARY_DIR}/modulefiles/cpprun/${PROJECT_VERSION} @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/modulefiles/cpprun/${PROJECT_VERSION}
        DESTINATION ${CMAKE_INSTALL_DATADIR}/modulefiles/cpprun)
install(DIRECTORY examples/mnist/data/ DESTINATION ${CMAKE_INSTALL_DATADIR}/cpprun/mnist
        FILES_MATCHING PATTERN "*.gz" PATTERN "LICENSE*" PATTERN "README.md")
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
install(DIRECTORY examples/python examples/slurm examples/mpi examples/containers examples/store
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples USE_SOURCE_PERMISSIONS)

set(CPACK_PACKAGE_NAME cpprun)
set(CPACK_PACKAGE_VENDOR "cpprun")
set(CPACK_PACKAGE_CONTACT "cpprun maintainers <cpprun@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "torchrun-style launcher for GPU clusters: rendezvous, TCPStore, supervision")
set(CPACK_PACKAGE_DESCRIPTION
    "cpprun starts one worker per GPU with torchrun's environment, serves the TCPStore they \
bootstrap from, supervises them (restarts, signal forwarding, no orphans, one root-cause \
report), and forms multi-node jobs under srun or mpirun. Includes cpprun-mnist, a C++ \
data-parallel MNIST trainer.")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# NCCL, the CUDA driver and hwloc are loaded at run time when present (dlopen), never required;
# hwloc (--numa-binding, --check's topology) is recommended.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libhwloc15")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torch, slurm-client, openmpi-bin")
if(CPPRUN_HAVE_CUDA)
  # cpprun-mnist's GPU engine links the CUDA runtime, cuBLAS and NCCL of the toolkit found at
  # build time; no Debian package provides them, so dpkg-shlibdeps is told they are the
  # machine's own, and the package says so.
  get_filename_component(CPPRUN_NCCL_LIBRARY_DIR ${NCCL_LIBRARY} DIRECTORY)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS
      ${CUDAToolkit_LIBRARY_DIR} ${CPPRUN_NCCL_LIBRARY_DIR})
  string(APPEND CPACK_PACKAGE_DESCRIPTION
         " This build's cpprun-mnist also trains on GPUs and needs the CUDA ${CUDAToolkit_VERSION} runtime, cuBLAS and NCCL libraries installed (not Debian packages).")
endif()
# `cpack` (and `make install`) do not build the whole tree first: after the main job
# (packaging/run-main.sh builds cpprun and cpprun-mnist), building cpprun-store and cpprun-man
# is enough for the .deb (README, "Quick start"), instead of every test target.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY TRUE)
set(CPACK_GENERATOR DEB)
include(CPack)
