# The whole model on the CUDA backend against the CPU backend, CUDA graphs of decode
# steps against plain steps, and batched against single-sequence decoding (label
# gpu): one ctest test per tiny model. Without a GPU (CI) each exits 77: skipped.
if(TARGET tpi_cuda)
  set(tpi_model_gpu_libs tpi_core tpi_loaders tpi_text tpi_kernels tpi_parallel tpi_model
      tpi_cuda)
  set(tpi_model_gpu_models qwen2-tiny-f16 qwen2-tiny-q4_0 qwen2-tiny-q5_k_m qwen3-tiny-bf16
      qwen3-tiny-q4_k_m qwen3-tiny-q6_k qwen3-tiny-q8_0 qwen3-tiny-q2_k qwen2-tiny-q3_k_m
          qwen2-tiny-iq4_xs)
  list(GET tpi_model_gpu_models 0 first)
  tpi_check_test(test_model_gpu SOURCES ${CMAKE_SOURCE_DIR}/tests/test_model_gpu.c
                 LIBS ${tpi_model_gpu_libs} LABELS gpu TIMEOUT 600 ARGS ${first})
  set_tests_properties(test_model_gpu PROPERTIES ENVIRONMENT "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive")
  foreach(m ${tpi_model_gpu_models})
    if(NOT m STREQUAL first)
      add_test(NAME test_model_gpu_${m} COMMAND test_model_gpu ${m})
      set_tests_properties(test_model_gpu_${m} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
                           LABELS gpu ENVIRONMENT "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive")
    endif()
  endforeach()
  # the decode attention letting wo's launch in after its K/V stream at every depth
  # (TPI_WO_PREFETCH=1; by default only from depth 2048, shallower calls at their start)
  add_test(NAME test_model_gpu_qwen3-tiny-q4_k_m_wo_prefetch COMMAND test_model_gpu
           qwen3-tiny-q4_k_m)
  set_tests_properties(test_model_gpu_qwen3-tiny-q4_k_m_wo_prefetch PROPERTIES
                       SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS gpu ENVIRONMENT
                       "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive;TPI_WO_PREFETCH=1")
  # the models with Q3_K or IQ4 weights, those held in another type (TPI_HOLD=1)
  foreach(m qwen2-tiny-q3_k_m qwen2-tiny-iq4_xs qwen3-tiny-q2_k)
    add_test(NAME test_model_gpu_${m}_held COMMAND test_model_gpu ${m})
    set_tests_properties(test_model_gpu_${m}_held PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
                         LABELS gpu ENVIRONMENT
                         "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive;TPI_HOLD=1")
  endforeach()
  # YaRN (TEST_ROPE_YARN=1): the scaled angles of every CUDA rope path against the CPU's
  add_test(NAME test_model_gpu_qwen3-tiny-q4_k_m_yarn COMMAND test_model_gpu qwen3-tiny-q4_k_m)
  set_tests_properties(test_model_gpu_qwen3-tiny-q4_k_m_yarn PROPERTIES
                       SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS gpu ENVIRONMENT
                       "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive;TEST_ROPE_YARN=1")
endif()
