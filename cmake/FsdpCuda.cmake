# The CUDA path: with FSDP_CUDA, link NCCL and the CUDA runtime and say so to the code
# (FSDP_WITH_CUDA). scripts/setup.sh also builds it in build-cuda/ against the same CUDA wheel where
# nvcc is present, so that CI compiles and links it on machines without a GPU.

set(FSDP_CUDA_HINTS $ENV{NCCL_ROOT} $ENV{CUDA_HOME} /usr/local/cuda)
find_path(FSDP_NCCL_INCLUDE_DIR nccl.h HINTS ${FSDP_CUDA_HINTS} PATH_SUFFIXES include)
find_path(FSDP_CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS ${FSDP_CUDA_HINTS} PATH_SUFFIXES include)

if(FSDP_CUDA)
  if(NOT TARGET torch_cuda)
    message(FATAL_ERROR "FSDP_CUDA needs a CUDA build of libtorch; ${Torch_DIR} is a CPU-only one. "
                        "Point CMAKE_PREFIX_PATH at torch.utils.cmake_prefix_path of a CUDA PyTorch.")
  endif()
  find_library(FSDP_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${FSDP_CUDA_HINTS} PATH_SUFFIXES lib lib64)
  if(NOT FSDP_NCCL_INCLUDE_DIR OR NOT FSDP_NCCL_LIBRARY)
    message(FATAL_ERROR "FSDP_CUDA: NCCL not found (nccl.h: ${FSDP_NCCL_INCLUDE_DIR}, library: ${FSDP_NCCL_LIBRARY}); "
                        "set NCCL_ROOT to a directory with include/nccl.h and lib/libnccl.so")
  endif()
  find_package(CUDAToolkit REQUIRED)
  # nccl.h is included by sources only (src/comm/nccl_process_group.cpp), never by a public header.
  target_include_directories(fsdp_core PRIVATE ${FSDP_NCCL_INCLUDE_DIR})
  target_link_libraries(fsdp_core PUBLIC ${FSDP_NCCL_LIBRARY} CUDA::cudart)
  target_compile_definitions(fsdp_core PUBLIC FSDP_WITH_CUDA=1)
  message(STATUS "fsdp.cpp: CUDA path ON (libtorch ${Torch_VERSION}, NCCL ${FSDP_NCCL_LIBRARY})")

  # fsdp.cpp's own kernels (src/models/fused_kernels.cu: SwiGLU, rotary, norms; src/shard/
  # nf4_kernels.cu: the NF4 decode) need a CUDA compiler;
  # without one the build goes on and CUDA tensors take the composed path
  # (fsdp::models::fused_kernels_compiled() says which). An object library of their own
  # (cmake/cuda_kernels/): nvcc sees neither libtorch's headers and flags nor the C++ targets'
  # precompiled header and warning flags.
  set(FSDP_CUDA_ARCHITECTURES "80;90" CACHE STRING "GPU architectures of fsdp.cpp's kernels (80: A100, 90: H100/H200)")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    add_subdirectory(${PROJECT_SOURCE_DIR}/cmake/cuda_kernels ${PROJECT_BINARY_DIR}/cuda_kernels)
    target_sources(fsdp_zoo PRIVATE $<TARGET_OBJECTS:fsdp_cuda_kernels>)
    target_sources(fsdp_core PRIVATE $<TARGET_OBJECTS:fsdp_core_cuda_kernels>)
    target_compile_definitions(fsdp_zoo PRIVATE FSDP_HAVE_CUDA_KERNELS=1)
    # The core's one user of its kernel alone: every target reuses the core's precompiled header,
    # which GCC refuses (-Winvalid-pch: each test source then compiled libtorch's headers anew, a
    # 291 s build on 16 cores, 2026-12-04) where it was made with a macro the user lacks.
    set_source_files_properties(${PROJECT_SOURCE_DIR}/src/shard/nf4_storage.cpp PROPERTIES
      COMPILE_DEFINITIONS FSDP_HAVE_CUDA_KERNELS=1)
    message(STATUS "fsdp.cpp: fused CUDA kernels ON (${CMAKE_CUDA_COMPILER}, architectures ${FSDP_CUDA_ARCHITECTURES})")
  else()
    message(WARNING "fsdp.cpp: no CUDA compiler (nvcc): the fused kernels and the NF4 decode kernel are left "
                    "out; CUDA tensors take the composed path")
  endif()
endif()

