# Helpers shared by apps, tests and benchmarks.

# fsdp_add_executable(name [NO_TORCH_PCH] sources...): an executable linked to fsdp::fsdp that
# reuses the library's precompiled libtorch header (a file including <torch/torch.h> costs ~20 s
# without it). NO_TORCH_PCH: for sources that include none of libtorch's headers but ATen's
# Tensor.h, where loading the 690 MB header costs more than it saves (fsdp-report: 18 s with it, 9
# without, 2026-12-04).
function(fsdp_add_executable name)
  cmake_parse_arguments(E "NO_TORCH_PCH" "" "" ${ARGN})
  add_executable(${name} ${E_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE fsdp::fsdp)
  if(NOT E_NO_TORCH_PCH)
    target_precompile_headers(${name} REUSE_FROM fsdp_core)
  endif()
  if(FSDP_UNITY_BUILD)
    set_target_properties(${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${FSDP_UNITY_BATCH})
  endif()
endfunction()

# Launch prefix for multi-rank runs: mpirun with --oversubscribe (CI has 2 cores, tests use up
# to 4 ranks), and the OpenMPI variables that allow running as root.
set(FSDP_MPIRUN ${MPIEXEC_EXECUTABLE} --oversubscribe --bind-to none)
execute_process(COMMAND id -u OUTPUT_VARIABLE FSDP_UID OUTPUT_STRIP_TRAILING_WHITESPACE)
set(FSDP_MPI_ENV OMP_NUM_THREADS=1)
if(FSDP_UID STREQUAL "0")
  list(APPEND FSDP_MPI_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
endif()

# fsdp_add_dist_test(NAME name COMMAND exe [args...] [RANKS 1 2 3 4] [TIMEOUT s] [LABELS ...]
#                    [PASS_REGEX re]):
# registers one CTest test per rank count, named name.np<N>, labelled `dist`, run under mpirun.
function(fsdp_add_dist_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT;PASS_REGEX" "COMMAND;RANKS;LABELS" ${ARGN})
  if(NOT T_RANKS)
    set(T_RANKS 1 2 3 4)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  foreach(n ${T_RANKS})
    add_test(NAME ${T_NAME}.np${n}
             COMMAND ${FSDP_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} ${n} ${T_COMMAND})
    # A rank computes on one thread (tests/dist/dist_main.cpp): one core a rank, up to the two of
    # CI's machine, so that ctest -j2 runs a one-rank test beside another test.
    if(n GREATER 1)
      set(cores 2)
    else()
      set(cores 1)
    endif()
    set_tests_properties(${T_NAME}.np${n} PROPERTIES
      LABELS "dist;${T_LABELS}" TIMEOUT ${T_TIMEOUT}
      ENVIRONMENT "${FSDP_MPI_ENV}" PROCESSORS ${cores})
    if(T_PASS_REGEX)
      set_tests_properties(${T_NAME}.np${n} PROPERTIES PASS_REGULAR_EXPRESSION "${T_PASS_REGEX}")
    endif()
  endforeach()
endfunction()
