# cmake --install: headers, the two libraries, the programs, and a CMake package so that a project
# of the user's can say
#   find_package(fsdp 0.2 REQUIRED COMPONENTS core)
#   target_link_libraries(app PRIVATE fsdp::core)
# The package finds libtorch, MPI (and with CUDA, the CUDA toolkit) again (fsdpConfig.cmake.in).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FSDP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/fsdp)
install(TARGETS fsdp_core fsdp_zoo EXPORT fsdpTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/fsdp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/fsdp/configs)  # the ready-to-run jobs
install(EXPORT fsdpTargets NAMESPACE fsdp:: DESTINATION ${FSDP_INSTALL_CMAKEDIR})

configure_package_config_file(cmake/fsdpConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/fsdpConfig.cmake
                              INSTALL_DESTINATION ${FSDP_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/fsdpConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fsdpConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/fsdpConfigVersion.cmake
        DESTINATION ${FSDP_INSTALL_CMAKEDIR})

# cpack -G DEB (in the build directory): a .deb of the libraries, headers, CMake package and the
# five programs, installed under /usr, depending on Debian's packages the build used. libtorch is
# not among them: the programs find the torch wheel they were built against where it was (their
# RPATH), so the package suits the machine that built it, or one with the same .venv/ path.
set(CPACK_PACKAGE_NAME fsdp-cpp)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Fully Sharded Data Parallel training in C++ on libtorch")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "fsdp.cpp developers")
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libopenmpi-dev, libpcre2-dev, openmpi-bin, nlohmann-json3-dev, zlib1g-dev, libtomlplusplus-dev, fortunes")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # fsdp-cpp_0.2.0_amd64.deb
include(CPack)
