# The fused ops (matmul_n, matmul_add, qk_norm_rope) against the plain ops they
# replace: the CPU cases in every build (label unit), the CUDA ones on a GPU (label gpu).
tpi_check_test(test_ops_fused SOURCES ${CMAKE_SOURCE_DIR}/tests/test_ops_fused.c
               LIBS tpi_core tpi_kernels LABELS unit ARGS cpu TIMEOUT 120)
if(TARGET tpi_cuda)
  add_test(NAME test_ops_fused_cuda COMMAND test_ops_fused cuda)
  set_tests_properties(test_ops_fused_cuda PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS gpu
                       ENVIRONMENT "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive")
endif()
