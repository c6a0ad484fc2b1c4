# Tokenizer tests (engine/text): HF reference cases for the Qwen3 and mini2048
# vocabularies, streaming decode, ChatML; and `tpinfer tokenize` end to end.
# quant.c is compiled in directly (the GGUF reader needs its traits table) rather
# than linking tpi_kernels, whose op table pulls in the CUDA backend.
set(TOK_TEST_SRCS ${CMAKE_SOURCE_DIR}/tests/test_tokenizer.c ${CMAKE_SOURCE_DIR}/engine/kernels/quant.c)
tpi_check_test(test_tokenizer SOURCES ${TOK_TEST_SRCS}
               LIBS tpi_core tpi_loaders tpi_text LABELS unit TIMEOUT 120)
tpi_check_test(test_tokenizer_cli SOURCES ${TOK_TEST_SRCS}
               LIBS tpi_core tpi_loaders tpi_text LABELS unit TIMEOUT 120)
target_compile_definitions(test_tokenizer_cli PRIVATE TOK_TEST_CLI=1)
# It runs the binary, so building the test builds tpinfer too.
add_dependencies(test_tokenizer_cli tpinfer)
