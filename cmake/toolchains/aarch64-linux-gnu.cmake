# Cross-build for 64-bit Arm Linux on a Debian 12 x86-64 host, with Debian's
# cross compiler and arm64 multiarch packages (scripts/arm.sh installs them):
#
#   dpkg --add-architecture arm64 && apt-get update
#   apt-get install g++-aarch64-linux-gnu qemu-user-static \
#     libhwy-dev:arm64 libgtest-dev:arm64 libbenchmark-dev:arm64 libgomp1:arm64
#   (libgomp1:arm64: the cross compiler links its own libgomp, but the aarch64
#   loader under qemu finds libraries in /usr/lib/aarch64-linux-gnu only)
#   cmake -S . -B build-arm -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
#     -DHEADSUM_WITH_ONEDNN=OFF
#
# There is no sysroot: multiarch puts the arm64 libraries and CMake package
# files in /usr/lib/aarch64-linux-gnu (headers stay in /usr/include, shared by
# both architectures), and CMAKE_LIBRARY_ARCHITECTURE makes find_package look
# there and not in /usr/lib/x86_64-linux-gnu.  scripts/arm.sh builds with
# -DHEADSUM_WITH_ONEDNN=OFF (without libdnnl-dev:arm64, oneDNN is not found
# and the option defaults to OFF anyway).
#
# Tests run under qemu user-mode emulation (ctest and gtest_discover_tests
# prepend CMAKE_CROSSCOMPILING_EMULATOR).  The multiarch libc6:arm64 puts the
# aarch64 loader at /lib/ld-linux-aarch64.so.1, so qemu needs no -L / QEMU_LD_PREFIX.
# Choose the emulated CPU with QEMU_CPU in the environment of ctest, e.g.
#   QEMU_CPU=cortex-a72        NEON only
#   QEMU_CPU=max,sve256=on     SVE/SVE2 with 256-bit vectors
#   QEMU_CPU=max               SVE/SVE2 with qemu-user's default 512-bit vectors
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(HEADSUM_CROSS_PREFIX aarch64-linux-gnu- CACHE STRING "Prefix of the cross tools")
set(CMAKE_C_COMPILER ${HEADSUM_CROSS_PREFIX}gcc)
set(CMAKE_CXX_COMPILER ${HEADSUM_CROSS_PREFIX}g++)
set(CMAKE_AR ${HEADSUM_CROSS_PREFIX}ar CACHE FILEPATH "Archiver")
set(CMAKE_RANLIB ${HEADSUM_CROSS_PREFIX}ranlib CACHE FILEPATH "Ranlib")

# Programs (cmake, python, qemu) are the host's; libraries, headers and
# packages are searched in the usual prefixes, where the arm64 ones are told
# apart by CMAKE_LIBRARY_ARCHITECTURE.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)

if(NOT CMAKE_CROSSCOMPILING_EMULATOR)
  find_program(HEADSUM_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
  if(HEADSUM_QEMU_AARCH64)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${HEADSUM_QEMU_AARCH64})
  endif()
endif()
