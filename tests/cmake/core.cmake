# Tests of the project-wide basics (engine/tpi.c).
tpi_check_test(test_core SOURCES ${CMAKE_SOURCE_DIR}/tests/test_core.c LIBS tpi_core LABELS unit)
