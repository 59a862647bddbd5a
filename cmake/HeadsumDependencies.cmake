# Dependency lookup: Debian 12 packages only (libhwy-dev, libdnnl-dev,
# libgtest-dev, libbenchmark-dev, gcc's libgomp).
find_package(hwy CONFIG REQUIRED)

if(HEADSUM_WITH_OPENMP)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
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
message(STATUS "headsum: oneDNN reference ${HEADSUM_WITH_ONEDNN}, OpenMP ${HEADSUM_WITH_OPENMP}")
