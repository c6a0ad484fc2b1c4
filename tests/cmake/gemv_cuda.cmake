# The v3 decode matrix-vector kernels (kern_gemv.cu) through their own entry points.
# One executable; the first argument picks the group. "host" emulates the kind-b
# (unit) kernel on the CPU (label unit, runs without a GPU); the per-type groups and "api"
# need a GPU (label gpu; exit 77 without one). "bench" is not a ctest test.
if(TARGET tpi_cuda)
  tpi_check_test(test_gemv_cuda SOURCES ${CMAKE_SOURCE_DIR}/tests/test_gemv_cuda.c
                 LIBS tpi_core tpi_kernels tpi_cuda LABELS unit ARGS host TIMEOUT 600)
  foreach(g api Q8_0 Q4_0 Q5_0 Q4_1 Q5_1 Q4_K Q5_K Q6_K Q3_K Q2_K IQ4_NL IQ4_XS BF16 F16)
    add_test(NAME test_gemv_cuda_${g} COMMAND test_gemv_cuda ${g})
    set_tests_properties(test_gemv_cuda_${g} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS gpu
                         ENVIRONMENT "CK_FORK=no;CK_DEFAULT_TIMEOUT=900;OMP_WAIT_POLICY=passive")
  endforeach()
endif()
