# Tests of the benchmark scripts under bench/ that others rely on to compare builds.
# bench/ab.sh on the CPU with a tiny synthetic model (tests/test_ab.sh says what it checks).
add_test(NAME bench_ab COMMAND bash ${CMAKE_SOURCE_DIR}/tests/test_ab.sh ${CMAKE_SOURCE_DIR}
         $<TARGET_FILE:tpinfer>)
set_tests_properties(bench_ab PROPERTIES LABELS unit TIMEOUT 120)
