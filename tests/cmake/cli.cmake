# Every command's stdout: its results to a file, and a full disk said so with exit 1
# (tests/test_cli_stdout.sh; skipped where /dev/full cannot be written).
add_test(NAME test_cli_stdout COMMAND bash ${CMAKE_SOURCE_DIR}/tests/test_cli_stdout.sh
         ${CMAKE_SOURCE_DIR} $<TARGET_FILE:tpinfer>)
set_tests_properties(test_cli_stdout PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)
