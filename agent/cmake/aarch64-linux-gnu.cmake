# Cross-compiling the agent for arm64 (aarch64) on an x86-64 machine with Debian's
# g++-aarch64-linux-gnu, against either a root filesystem of Debian's arm64 packages
# (ARM64_SYSROOT; hack/arm64.sh makes one and runs the result under qemu-aarch64) or, without it,
# Debian's arm64 libraries installed beside this machine's (multiarch: the Dockerfile's builder).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
if(DEFINED ENV{ARM64_SYSROOT})
  set(CMAKE_SYSROOT $ENV{ARM64_SYSROOT})
endif()
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Programs (cmake, pkg-config) from this machine; libraries, headers and packages from the sysroot.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# How this machine runs what is built (gtest_discover_tests lists the tests with it).
if(DEFINED ENV{ARM64_SYSROOT})
  set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L $ENV{ARM64_SYSROOT})
else()
  set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
endif()
