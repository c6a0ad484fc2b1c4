# Tests of the Qwen model (engine/model): config, shard plan, sampling, logits and
# perplexity against llama.cpp's runs of the tiny models, and multi-rank TP/PP runs
# against the single-rank model (test_parallel, under mpirun).
set(TPI_MODEL_LIBS tpi_core tpi_loaders tpi_text tpi_kernels tpi_parallel tpi_model)
if(TPI_HAVE_CUDA)
  list(APPEND TPI_MODEL_LIBS tpi_cuda)
endif()

# tpi_model_test(NAME EXE [NP n] [TIMEOUT s] ARGS ...): another ctest test of an
# executable built by tpi_check_test, with the same properties.
function(tpi_model_test name exe)
  cmake_parse_arguments(T "" "NP;TIMEOUT" "ARGS" ${ARGN})
  if(T_NP)
    add_test(NAME ${name} COMMAND ${TPI_MPIRUN} -np ${T_NP} $<TARGET_FILE:${exe}> ${T_ARGS})
  else()
    add_test(NAME ${name} COMMAND ${exe} ${T_ARGS})
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT ${T_TIMEOUT} LABELS unit
                       ENVIRONMENT "CK_DEFAULT_TIMEOUT=${T_TIMEOUT};OMPI_MCA_rmaps_base_oversubscribe=1;OMP_WAIT_POLICY=passive")
endfunction()

tpi_check_test(test_model SOURCES ${CMAKE_SOURCE_DIR}/tests/test_model.c
               LIBS ${TPI_MODEL_LIBS} LABELS unit TIMEOUT 120 ARGS unit)
foreach(m qwen2-tiny-f16 qwen2-tiny-q4_0 qwen2-tiny-q5_k_m qwen3-tiny-bf16 qwen3-tiny-q4_k_m
          qwen3-tiny-q6_k qwen3-tiny-q8_0 qwen3-tiny-q2_k qwen2-tiny-q3_k_m
          qwen2-tiny-iq4_xs)
  tpi_model_test(test_model_logits_${m} test_model TIMEOUT 120 ARGS logits ${m})
endforeach()
# YaRN: llama.cpp's runs with --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 256
# (tests/data/NAME.yarn.ref.json), given as those options and as rope.scaling.* keys.
foreach(m qwen2-tiny-q4_0 qwen3-tiny-q4_k_m)
  tpi_model_test(test_model_logits_yarn_${m} test_model TIMEOUT 120 ARGS logits_yarn ${m})
  tpi_model_test(test_model_logits_yarn_keys_${m} test_model TIMEOUT 120 ARGS logits_yarn_keys ${m})
endforeach()
# llama-perplexity -c 128 of ppl-text.txt (../shared/data/README.md).
foreach(pair "qwen3-tiny-bf16=3151032.72" "qwen3-tiny-q8_0=3158560.69"
             "qwen3-tiny-q4_k_m=3206870.95" "qwen2-tiny-f16=47010868703.23"
             "qwen2-tiny-q4_0=47560229197.70")
  string(REPLACE "=" ";" kv ${pair})
  list(GET kv 0 m)
  list(GET kv 1 ppl)
  tpi_model_test(test_model_ppl_${m} test_model TIMEOUT 300 ARGS ppl ${m} ${ppl})
endforeach()
# The same through `tpinfer perplexity` (stdout, exit codes, argument errors).
tpi_model_test(test_perplexity_cli test_model TIMEOUT 300 ARGS ppl_cli qwen3-tiny-q4_k_m 3206870.95)
add_dependencies(test_model tpinfer)

# Multi-rank runs against the single-rank model (CPU backend, MPI communicator).
# TPxPP lists: every configuration whose tp*pp equals NP runs on the models given
# (default: all ten tiny models).
tpi_check_test(test_parallel_np2 SOURCES ${CMAKE_SOURCE_DIR}/tests/test_parallel.c
               LIBS ${TPI_MODEL_LIBS} LABELS unit NP 2 TIMEOUT 300 ARGS 2x1,1x2)
set(TPI_PAR_ENV "OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_mpi_yield_when_idle=1;OMP_WAIT_POLICY=passive")
set_tests_properties(test_parallel_np2 PROPERTIES ENVIRONMENT "${TPI_PAR_ENV}")
function(tpi_parallel_test name np)
  tpi_model_test(${name} test_parallel_np2 NP ${np} TIMEOUT 300 ARGS ${ARGN})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${TPI_PAR_ENV}")
endfunction()
tpi_parallel_test(test_parallel_np4_tp2pp2 4 2x2)
tpi_parallel_test(test_parallel_np4_tp4 4 4x1)
tpi_parallel_test(test_parallel_np4_pp4 4 1x4 qwen3-tiny-bf16 qwen3-tiny-q4_k_m qwen3-tiny-q6_k
                  qwen3-tiny-q8_0 qwen2-tiny-f16)
# pp 3 on the 4-layer models (2,1,1 layers) and the tp = 3 error on 8 heads.
tpi_parallel_test(test_parallel_np3 3 1x3,3x1 qwen3-tiny-bf16 qwen3-tiny-q4_k_m qwen3-tiny-q6_k
                  qwen3-tiny-q8_0)
# tp 8 > 4 KV heads: KV heads replicated (8 ranks oversubscribed on 2 cores).
tpi_parallel_test(test_parallel_np8_tp8 8 8x1 qwen3-tiny-q4_k_m qwen3-tiny-bf16)
# The same on GPUs, one per rank, over NCCL (label gpu; skipped below 2 GPUs).
tpi_parallel_test(test_parallel_gpu_np2 2 2x1,1x2 qwen3-tiny-bf16 qwen3-tiny-q8_0
                  qwen3-tiny-q4_k_m qwen2-tiny-q4_0)
set_tests_properties(test_parallel_gpu_np2 PROPERTIES LABELS gpu SKIP_RETURN_CODE 77
                     ENVIRONMENT "${TPI_PAR_ENV};TPI_TEST_BACKEND=cuda;TPI_TEST_COMM=nccl")
# The tpinfer binary under mpirun: identity mismatch, missing file, end to end.
tpi_model_test(test_parallel_cli test_parallel_np2 TIMEOUT 300 ARGS cli ${MPIEXEC_EXECUTABLE})
