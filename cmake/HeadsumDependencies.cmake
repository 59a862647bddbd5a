# Dependency lookup: Debian 12 packages only (libhwy-dev, libdnnl-dev,
# libgtest-dev, libbenchmark-dev, gcc's libgomp).
find_package(hwy CONFIG REQUIRED)

if(HEADSUM_WITH_OPENMP)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  # What the installed headsum target links for OpenMP: the runtime this
  # build compiled against, as paths (gcc: libgomp.so, libpthread), so that
  # the package config needs no find_dependency(OpenMP COMPONENTS CXX) and
  # works in a C-only project.  Empty where the compiler's flag alone links
  # the runtime; CMakeLists.txt then exports OpenMP_CXX_FLAGS as a link option.
  set(HEADSUM_OPENMP_INSTALL_LINK ${OpenMP_CXX_LIBRARIES})
endif()

# The C++ runtime that libheadsum.a needs when a C program links it with the
# C driver: the libraries the C++ driver links implicitly and the C driver
# does not (stdc++ and m with GCC; libc++'s with clang -stdlib=libc++).
# Exported on headsum for C links only, and in headsum.pc's Libs.private.
set(HEADSUM_CXX_RUNTIME_LIBS ${CMAKE_CXX_IMPLICIT_LINK_LIBRARIES})
if(HEADSUM_CXX_RUNTIME_LIBS)
  list(REMOVE_DUPLICATES HEADSUM_CXX_RUNTIME_LIBS)
  if(CMAKE_C_IMPLICIT_LINK_LIBRARIES)
    list(REMOVE_ITEM HEADSUM_CXX_RUNTIME_LIBS ${CMAKE_C_IMPLICIT_LINK_LIBRARIES})
  endif()
else()
  set(HEADSUM_CXX_RUNTIME_LIBS stdc++ m)   # the compiler's were not detected
endif()

# oneDNN is optional: ON when found unless the user says otherwise.
if(NOT DEFINED HEADSUM_WITH_ONEDNN)
  find_package(dnnl CONFIG QUIET)
  set(_headsum_onednn_default ${dnnl_FOUND})
else()
  set(_headsum_onednn_default ${HEADSUM_WITH_ONEDNN})
endif()
option(HEADSUM_WITH_ONEDNN "Build the oneDNN reference paths" ${_headsum_onednn_default})
if(HEADSUM_WITH_ONEDNN)
  find_package(dnnl CONFIG REQUIRED)
endif()
message(STATUS "headsum: oneDNN reference ${HEADSUM_WITH_ONEDNN}, OpenMP ${HEADSUM_WITH_OPENMP}, "
               "C++ runtime for C links: ${HEADSUM_CXX_RUNTIME_LIBS}")
