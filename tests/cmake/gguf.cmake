# Tests of the GGUF reader/writer (loaders/gguf.c, loaders/gguf_write.c) and `tpinfer info`.
tpi_check_test(test_gguf SOURCES ${CMAKE_SOURCE_DIR}/tests/test_gguf.c
               LIBS tpi_core tpi_loaders tpi_kernels LABELS unit TIMEOUT 120)
tpi_check_test(test_gguf_broken SOURCES ${CMAKE_SOURCE_DIR}/tests/test_gguf_broken.c
               LIBS tpi_core tpi_loaders tpi_kernels LABELS unit TIMEOUT 120)
# test_gguf_broken runs the real binary (`tpinfer info` on broken files).
add_dependencies(test_gguf_broken tpinfer)
