# Tests of the tensor-type traits table (engine/kernels/quant.c). quant.c is
# compiled in directly: the rest of tpi_kernels (the op table) pulls in the
# CUDA backend, which this test does not need.
tpi_check_test(test_quant
               SOURCES ${CMAKE_SOURCE_DIR}/tests/test_quant.c ${CMAKE_SOURCE_DIR}/engine/kernels/quant.c
               LIBS tpi_core LABELS unit TIMEOUT 120)
# The same with the baseline bodies where quant.c has an AVX2 form too (the AVX2 ones
# run above wherever the CPU has AVX2).
add_test(NAME test_quant_baseline COMMAND test_quant)
set_tests_properties(test_quant_baseline PROPERTIES LABELS unit TIMEOUT 120
                     ENVIRONMENT "CK_DEFAULT_TIMEOUT=120;TPI_CPU_BASELINE=1")

# The synthetic model writer (loaders/synth.c) and `tpinfer mkmodel`; the CLI
# part runs the built binary (skipped when it is not built).
tpi_check_test(test_mkmodel
               SOURCES ${CMAKE_SOURCE_DIR}/tests/test_mkmodel.c ${CMAKE_SOURCE_DIR}/engine/kernels/quant.c
               LIBS tpi_core tpi_loaders LABELS unit TIMEOUT 120)
