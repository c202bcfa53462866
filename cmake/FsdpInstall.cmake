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

# pkg-config, for builds without CMake: `pkg-config --cflags --libs fsdp` gives the headers and
# both libraries with libtorch's (where it was found at build time) and MPI's flags.
list(JOIN TORCH_INCLUDE_DIRS " -isystem " FSDP_PC_TORCH_CFLAGS)
# Relocatable: the prefix is found from the .pc file's own place (cmake --install --prefix, the .deb).
file(RELATIVE_PATH FSDP_PC_PREFIX_FROM_PCDIR "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
configure_file(cmake/fsdp.pc.in ${CMAKE_CURRENT_BINARY_DIR}/fsdp.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fsdp.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# cpack -G DEB (in the build directory; scripts/make-deb.sh): a .deb of the libraries, headers,
# CMake package, pkg-config file and the five programs, installed under /usr, depending on the
# Debian packages the build used. libtorch is not a Debian package: with FSDP_BUNDLE_LIBTORCH
# (make-deb.sh sets it) the package carries the libtorch libraries the programs need, from the
# torch wheel the build used, in /usr/lib/fsdp-cpp/, which the programs' RPATH names first; so it
# installs and runs the main job on a fresh Debian 12 (scripts/test-deb.sh checks that in a
# debootstrap'ed one). Compiling against the installed libraries still needs a libtorch
# (pip install torch==<the same version>; find_package finds it through Torch_DIR).
option(FSDP_BUNDLE_LIBTORCH "Install the libtorch libraries the programs load into lib/fsdp-cpp (for the .deb)" OFF)
if(FSDP_BUNDLE_LIBTORCH)
  if(FSDP_CUDA)
    message(FATAL_ERROR "FSDP_BUNDLE_LIBTORCH: the .deb is the CPU build (configure without FSDP_CUDA)")
  endif()
  # libtorch_cpu's own RPATH ends in $ORIGIN: the CUDA runtime libraries it names (the wheel is a
  # CUDA build; nothing CUDA runs on the CPU path) are found beside it.
  file(GLOB FSDP_BUNDLED_LIBRARIES
       ${TORCH_INSTALL_PREFIX}/lib/libtorch_cpu.so ${TORCH_INSTALL_PREFIX}/lib/libc10.so ${TORCH_INSTALL_PREFIX}/lib/libgomp*.so*
       ${TORCH_INSTALL_PREFIX}/../nvidia/*/lib/libcudart.so.[0-9]* ${TORCH_INSTALL_PREFIX}/../nvidia/*/lib/libcupti.so.[0-9]*
       ${TORCH_INSTALL_PREFIX}/../nvidia/cuda_runtime/lib/libcudart.so.[0-9]* ${TORCH_INSTALL_PREFIX}/../nvidia/cuda_cupti/lib/libcupti.so.[0-9]*)
  message(STATUS "fsdp.cpp: the .deb bundles ${FSDP_BUNDLED_LIBRARIES}")
  install(FILES ${FSDP_BUNDLED_LIBRARIES} DESTINATION ${CMAKE_INSTALL_LIBDIR}/fsdp-cpp)
endif()
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)  # xz on half a gigabyte of libtorch takes minutes on 2 cores
set(CPACK_PACKAGE_NAME fsdp-cpp)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Fully Sharded Data Parallel training in C++ on libtorch")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "fsdp.cpp developers")
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libopenmpi-dev, libpcre2-dev, libutf8proc-dev, openmpi-bin, nlohmann-json3-dev, zlib1g-dev, libtomlplusplus-dev, fortunes")
if(FSDP_TCMALLOC)  # the apps' malloc (apps/CMakeLists.txt)
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libtcmalloc-minimal4")
endif()
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # fsdp-cpp_0.2.0_amd64.deb
include(CPack)
