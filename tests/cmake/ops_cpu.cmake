# Tests of the CPU reference backend (engine/kernels/ops_cpu.c, ops_registry.c).
set(_ops_cpu_libs tpi_core tpi_kernels)
if(TPI_HAVE_CUDA)
  # with CUDA, ops_registry.c calls ops_cuda_get/ops_cuda_available from the .cu files
  list(APPEND _ops_cpu_libs tpi_cuda)
endif()
tpi_check_test(test_ops_cpu SOURCES ${CMAKE_SOURCE_DIR}/tests/test_ops_cpu.c
               LIBS ${_ops_cpu_libs} LABELS unit TIMEOUT 120)
