# What the Python wheel installs (pyproject.toml; scikit-build-core installs the `wheel`
# component): the launcher and the standalone store, as scripts, so that pip puts them into
# the environment's bin/. The trainer, the man page, completion and modulefile are the .deb's
# and `cmake --install`'s (cmake/Packaging.cmake), not the wheel's.
install(TARGETS cpprun cpprun-store RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR} COMPONENT wheel)
# Stripped when linked (the wheels' zig toolchain cannot strip afterwards: pyproject.toml turns
# install's strip off), whichever compiler builds the wheel: pip install ., the sdist, zig. zig
# keeps debug information even in Release: unstripped, the x86_64 wheel is 21 MB, not 5.
target_link_options(cpprun PRIVATE -s)
target_link_options(cpprun-store PRIVATE -s)
