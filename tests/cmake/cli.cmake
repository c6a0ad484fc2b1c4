# Every command's stdout: its results to a file, and a full disk said so with exit 1
# (tests/test_cli_stdout.sh; skipped where /dev/full cannot be written).
add_test(NAME test_cli_stdout COMMAND bash ${CMAKE_SOURCE_DIR}/tests/test_cli_stdout.sh
         ${CMAKE_SOURCE_DIR} $<TARGET_FILE:tpinfer>)
set_tests_properties(test_cli_stdout PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)

# The sampling options and --seed shared by run -p and run -f: ranges refused with exit 2
# before loading, and --seed -1's reported seed repeats the run (tests/test_cli_args.sh).
add_test(NAME test_cli_args COMMAND bash ${CMAKE_SOURCE_DIR}/tests/test_cli_args.sh
         ${CMAKE_SOURCE_DIR} $<TARGET_FILE:tpinfer>)
set_tests_properties(test_cli_args PROPERTIES LABELS unit TIMEOUT 120)
