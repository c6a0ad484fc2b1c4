# Batch prompt files (engine/sched, engine/cli/cmd_batch.c): input formats and
# error records, --parallel / --ubatch invariance, n completions per request, shared
# prompt prefixes, echo with prompt logprobs, chats through Qwen3's template, vLLM's
# stop_token_ids / min_tokens / ignore_eos, kill -9 + --resume, SIGTERM, and tp 2 / pp 2 under mpirun against
# one rank. The tests run `tpinfer run -f`.

tpi_check_test(test_batch SOURCES ${CMAKE_SOURCE_DIR}/tests/test_batch.c
               LIBS tpi_core LABELS unit TIMEOUT 120 ARGS inputs)
target_compile_definitions(test_batch PRIVATE
  TPI_BATCH_DRIVER="$<TARGET_FILE:tpinfer>"
  TPI_MPIEXEC="${MPIEXEC_EXECUTABLE}")
add_dependencies(test_batch tpinfer)
foreach(mode parallel choices prefix echo ends chat resume sigterm mpi_tp mpi_pp)
  add_test(NAME test_batch_${mode} COMMAND test_batch ${mode})
  set_tests_properties(test_batch_${mode} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120 LABELS unit
                       ENVIRONMENT "CK_DEFAULT_TIMEOUT=120;OMPI_MCA_rmaps_base_oversubscribe=1;OMP_WAIT_POLICY=passive")
endforeach()
