# Installation: libheadsum.a, the headers and a CMake package config so that
# find_package(headsum CONFIG REQUIRED) + headsum::headsum works elsewhere,
# and find_package(headsum CONFIG REQUIRED COMPONENTS mpi) + headsum::mpi.
#
# Two export sets: headsumTargets.cmake (headsum::headsum, which links
# hwy::hwy, DNNL::dnnl, the OpenMP runtime by path and, for C links, the C++
# runtime: nothing that needs a particular language enabled) and
# headsumMpiTargets.cmake (headsum::mpi, which links MPI::MPI_C), which
# headsumConfig.cmake loads only for the mpi component, so that a consumer
# without it never looks for MPI.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(HEADSUM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/headsum)
install(TARGETS headsum EXPORT headsumTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/headsum DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT headsumTargets NAMESPACE headsum:: DESTINATION ${HEADSUM_CMAKE_DIR})
if(TARGET headsum_mpi)
  install(TARGETS headsum_mpi EXPORT headsumMpiTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT headsumMpiTargets NAMESPACE headsum:: DESTINATION ${HEADSUM_CMAKE_DIR})
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/headsumConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/headsumConfig.cmake
  INSTALL_DESTINATION ${HEADSUM_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/headsumConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/headsumConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/headsumConfigVersion.cmake
        DESTINATION ${HEADSUM_CMAKE_DIR})

# pkg-config: headsum.pc, for builds that do not use CMake
# (cc app.c $(pkg-config --cflags --libs --static headsum)).  The static
# library's own dependencies are private: libhwy through Requires.private,
# the C++ runtime (HEADSUM_CXX_RUNTIME_LIBS: -lstdc++ -lm with GCC), OpenMP
# and oneDNN in Libs.private, as this build uses them.
file(RELATIVE_PATH _headsum_pc_up "/_/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/_")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(HEADSUM_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(HEADSUM_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  string(REGEX REPLACE "/$" "" _headsum_pc_up "\${pcfiledir}/${_headsum_pc_up}")
  set(HEADSUM_PC_PREFIX "${_headsum_pc_up}")
  set(HEADSUM_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(HEADSUM_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(HEADSUM_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
set(HEADSUM_PC_LIBS_PRIVATE "")
if(HEADSUM_WITH_ONEDNN)
  get_target_property(_headsum_dnnl_lib DNNL::dnnl LOCATION)
  get_filename_component(_headsum_dnnl_dir "${_headsum_dnnl_lib}" DIRECTORY)
  if(_headsum_dnnl_dir AND NOT _headsum_dnnl_dir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
    string(APPEND HEADSUM_PC_LIBS_PRIVATE "-L${_headsum_dnnl_dir} ")
  endif()
  string(APPEND HEADSUM_PC_LIBS_PRIVATE "-ldnnl ")
endif()
if(HEADSUM_WITH_OPENMP)
  string(APPEND HEADSUM_PC_LIBS_PRIVATE "${OpenMP_CXX_FLAGS} ")
endif()
foreach(_headsum_rt_lib IN LISTS HEADSUM_CXX_RUNTIME_LIBS)
  if(IS_ABSOLUTE "${_headsum_rt_lib}" OR _headsum_rt_lib MATCHES "^-")
    string(APPEND HEADSUM_PC_LIBS_PRIVATE "${_headsum_rt_lib} ")
  else()
    string(APPEND HEADSUM_PC_LIBS_PRIVATE "-l${_headsum_rt_lib} ")
  endif()
endforeach()
string(STRIP "${HEADSUM_PC_LIBS_PRIVATE}" HEADSUM_PC_LIBS_PRIVATE)
configure_file(${CMAKE_CURRENT_LIST_DIR}/headsum.pc.in ${CMAKE_CURRENT_BINARY_DIR}/headsum.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/headsum.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
