# The CUDA path: with FSDP_CUDA, link NCCL and say so to the code (FSDP_WITH_CUDA); without it,
# compile the CUDA sources alone where the toolkit is present (fsdp_cuda_compile_check).

# Sources that need CUDA headers (c10/cuda, cuda_runtime_api.h, nccl.h).
set(FSDP_CUDA_SOURCES src/comm/nccl_process_group.cpp src/runtime/device_memory_cuda.cpp)

set(FSDP_CUDA_HINTS $ENV{NCCL_ROOT} $ENV{CUDA_HOME} /usr/local/cuda)
find_path(FSDP_NCCL_INCLUDE_DIR nccl.h HINTS ${FSDP_CUDA_HINTS} PATH_SUFFIXES include)
find_path(FSDP_CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS ${FSDP_CUDA_HINTS} PATH_SUFFIXES include)

if(FSDP_CUDA)
  if(Torch_VERSION VERSION_LESS 2.0)
    message(FATAL_ERROR "FSDP_CUDA needs a CUDA libtorch 2.x; CMAKE_PREFIX_PATH found libtorch ${Torch_VERSION} "
                        "(Debian's CPU build?). Point it at torch.utils.cmake_prefix_path.")
  endif()
  find_library(FSDP_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${FSDP_CUDA_HINTS} PATH_SUFFIXES lib lib64)
  if(NOT FSDP_NCCL_INCLUDE_DIR OR NOT FSDP_NCCL_LIBRARY)
    message(FATAL_ERROR "FSDP_CUDA: NCCL not found (nccl.h: ${FSDP_NCCL_INCLUDE_DIR}, library: ${FSDP_NCCL_LIBRARY}); "
                        "set NCCL_ROOT to a directory with include/nccl.h and lib/libnccl.so")
  endif()
  if(Torch_VERSION VERSION_GREATER_EQUAL 2.12)
    # libtorch's headers stop compiling as C++17 around 2.12 (found by reading, not yet by a build).
    target_compile_features(fsdp_core PUBLIC cxx_std_20)
    target_compile_features(fsdp_config_reader PRIVATE cxx_std_20)
  endif()
  find_package(CUDAToolkit REQUIRED)
  target_include_directories(fsdp_core PUBLIC ${FSDP_NCCL_INCLUDE_DIR})
  target_link_libraries(fsdp_core PUBLIC ${FSDP_NCCL_LIBRARY} CUDA::cudart)
  target_compile_definitions(fsdp_core PUBLIC FSDP_WITH_CUDA=1)
  message(STATUS "fsdp.cpp: CUDA path ON (libtorch ${Torch_VERSION}, NCCL ${FSDP_NCCL_LIBRARY})")
  return()
endif()

set(FSDP_CUDA_COMPILE_CHECK_ON OFF)
if(FSDP_CUDA_COMPILE_CHECK STREQUAL "ON")
  if(NOT FSDP_NCCL_INCLUDE_DIR OR NOT FSDP_CUDART_INCLUDE_DIR)
    message(FATAL_ERROR "FSDP_CUDA_COMPILE_CHECK=ON but nccl.h or cuda_runtime_api.h was not found (set CUDA_HOME or NCCL_ROOT)")
  endif()
  set(FSDP_CUDA_COMPILE_CHECK_ON ON)
elseif(FSDP_CUDA_COMPILE_CHECK STREQUAL "AUTO" AND FSDP_NCCL_INCLUDE_DIR AND FSDP_CUDART_INCLUDE_DIR)
  set(FSDP_CUDA_COMPILE_CHECK_ON ON)
endif()

if(FSDP_CUDA_COMPILE_CHECK_ON)
  # Compiled with every build, linked into nothing: Debian's libtorch has the c10/cuda headers but
  # no CUDA libraries. The one header its CPU build lacks is supplied from cmake/cuda_compile_check.
  add_library(fsdp_cuda_compile_check OBJECT ${FSDP_CUDA_SOURCES})
  target_compile_features(fsdp_cuda_compile_check PRIVATE cxx_std_17)
  target_include_directories(fsdp_cuda_compile_check PRIVATE ${PROJECT_SOURCE_DIR}/include
    ${PROJECT_SOURCE_DIR}/cmake/cuda_compile_check ${FSDP_NCCL_INCLUDE_DIR} ${FSDP_CUDART_INCLUDE_DIR})
  target_link_libraries(fsdp_cuda_compile_check PRIVATE ${TORCH_LIBRARIES})
  target_compile_definitions(fsdp_cuda_compile_check PRIVATE FSDP_WITH_CUDA=1)
  target_compile_options(fsdp_cuda_compile_check PRIVATE -Wall -Wextra -Wno-unused-parameter -Werror)
  message(STATUS "fsdp.cpp: CUDA sources compile-checked against ${FSDP_CUDART_INCLUDE_DIR} (not linked, not run)")
else()
  message(STATUS "fsdp.cpp: CUDA path OFF; no CUDA toolkit found to compile-check its sources")
endif()
