# Installation: libheadsum.a, the headers and a CMake package config so that
# find_package(headsum CONFIG REQUIRED) + headsum::headsum works elsewhere.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS headsum EXPORT headsumTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/headsum DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT headsumTargets NAMESPACE headsum::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/headsum)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/headsumConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/headsumConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/headsum)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/headsumConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/headsumConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/headsumConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/headsum)
