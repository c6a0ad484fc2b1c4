# Tests of the parallel runtime (engine/parallel: grid, comm, MPI/NCCL) and `tpinfer comm`.
set(_par_libs tpi_core tpi_parallel tpi_kernels)
if(TPI_HAVE_CUDA)
  # ops_registry.c (tpi_kernels) calls ops_cuda_get / ops_cuda_available from the .cu files
  list(APPEND _par_libs tpi_cuda)
endif()

# grid: one rank (launched without mpirun), 2 and 4 ranks
tpi_check_test(test_grid SOURCES ${CMAKE_SOURCE_DIR}/tests/test_grid.c
               LIBS ${_par_libs} LABELS unit TIMEOUT 60)
foreach(np 2 4)
  tpi_check_test(test_grid_np${np} SOURCES ${CMAKE_SOURCE_DIR}/tests/test_grid.c
                 LIBS ${_par_libs} LABELS unit NP ${np} TIMEOUT 60)
  tpi_check_test(test_comm_np${np} SOURCES ${CMAKE_SOURCE_DIR}/tests/test_comm.c
                 LIBS ${_par_libs} LABELS unit NP ${np} TIMEOUT 120)
endforeach()

# `tpinfer comm` end to end: the test itself launches mpirun -np 2.
tpi_check_test(test_comm_cli SOURCES ${CMAKE_SOURCE_DIR}/tests/test_comm.c
               LIBS ${_par_libs} LABELS unit TIMEOUT 300 ARGS --cli)
target_compile_definitions(test_comm_cli PRIVATE TPI_MPIEXEC="${MPIEXEC_EXECUTABLE}")
add_dependencies(test_comm_cli tpinfer)

# The NCCL communicator and its peer all-reduce on GPUs, one per rank (label gpu;
# skipped without two GPUs).
if(TPI_HAVE_CUDA)
  tpi_check_test(test_comm_gpu SOURCES ${CMAKE_SOURCE_DIR}/tests/test_comm_gpu.c
                 LIBS ${_par_libs} LABELS gpu NP 2 TIMEOUT 300)
endif()

# The device-wait watchdog with a probe the test controls (no MPI, no GPU).
tpi_check_test(test_watchdog SOURCES ${CMAKE_SOURCE_DIR}/tests/test_watchdog.c
               LIBS ${_par_libs} LABELS unit TIMEOUT 60)
