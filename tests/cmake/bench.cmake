# `tpinfer bench` (engine/cli/cmd_bench.c, bench_report.c): run through the binary
# under mpirun (tp 2, pp 2, every output format, errors), plus the formatting
# helpers linked directly. CPU backend, MPI communicator, the tiny Q4_K_M model.
tpi_check_test(test_bench
               SOURCES ${CMAKE_SOURCE_DIR}/tests/test_bench.c
                       ${CMAKE_SOURCE_DIR}/engine/cli/bench_report.c
               LIBS tpi_core LABELS unit TIMEOUT 240)
target_compile_definitions(test_bench PRIVATE TPI_MPIEXEC="${MPIEXEC_EXECUTABLE}")
# The test runs the binary: build it first.
add_dependencies(test_bench tpinfer)
