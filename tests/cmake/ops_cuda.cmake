# GPU tests of the CUDA op table against the CPU reference (label gpu). One
# executable; each group is its own ctest test (the first argument picks it).
# Without a GPU every test exits 77 and ctest reports it skipped.
if(TARGET tpi_cuda)
  tpi_check_test(test_ops_cuda_elem SOURCES ${CMAKE_SOURCE_DIR}/tests/test_ops_cuda.c
                 LIBS tpi_core tpi_kernels tpi_cuda LABELS gpu ARGS elem TIMEOUT 600)
  set(tpi_ops_cuda_groups embed attn_prefill attn_decode)
  foreach(t F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K Q3_K Q2_K IQ4_NL IQ4_XS)
    list(APPEND tpi_ops_cuda_groups matmul_${t})
  endforeach()
  foreach(g ${tpi_ops_cuda_groups})
    add_test(NAME test_ops_cuda_${g} COMMAND test_ops_cuda_elem ${g})
    set_tests_properties(test_ops_cuda_${g} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS gpu
                         ENVIRONMENT "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive")
  endforeach()
  # the types TPI_HOLD=1 holds in another, held so
  foreach(t Q3_K IQ4_NL IQ4_XS)
    add_test(NAME test_ops_cuda_matmul_${t}_held COMMAND test_ops_cuda_elem matmul_${t})
    set_tests_properties(test_ops_cuda_matmul_${t}_held PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
                         LABELS gpu ENVIRONMENT
                         "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive;TPI_HOLD=1")
  endforeach()
  # kern_mmq's bf16 decoders for the types with a raw path (Q4_K, Q6_K's groups)
  foreach(t Q4_K Q6_K)
    add_test(NAME test_ops_cuda_matmul_${t}_noraw COMMAND test_ops_cuda_elem matmul_${t})
    set_tests_properties(test_ops_cuda_matmul_${t}_noraw PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
                         LABELS gpu ENVIRONMENT
                         "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive;TPI_MMQ_RAW=0")
  endforeach()
  add_test(NAME test_ops_cuda_embed_held COMMAND test_ops_cuda_elem embed)
  set_tests_properties(test_ops_cuda_embed_held PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
                       LABELS gpu ENVIRONMENT
                       "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive;TPI_HOLD=1")
  # the attention launchers' host-side planning, the layer tail's row split and kern_mmq's
  # staging orders (test_xp_order): runs without a GPU (label unit)
  add_test(NAME test_ops_cuda_host COMMAND test_ops_cuda_elem host)
  set_tests_properties(test_ops_cuda_host PROPERTIES TIMEOUT 120 LABELS unit)
  # the decode attention's split-K merged through global memory (the cluster merge off),
  # deep calls copying their first tiles after the prologue (TPI_ATTN_DEC_PREW=0)
  add_test(NAME test_ops_cuda_attn_decode_nocluster COMMAND test_ops_cuda_elem attn_decode)
  set_tests_properties(test_ops_cuda_attn_decode_nocluster PROPERTIES SKIP_RETURN_CODE 77
                       TIMEOUT 600 LABELS gpu ENVIRONMENT
                       "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive;TPI_ATTN_DEC_CLUSTER=0;TPI_ATTN_DEC_PREW=0")
  # the decode attention's other block shape (4 warps, 64-key tiles) at 3 stages (two
  # blocks an SM: other cluster sizes fit), then alone at 5 with global merging off
  add_test(NAME test_ops_cuda_attn_decode_w4 COMMAND test_ops_cuda_elem attn_decode)
  set_tests_properties(test_ops_cuda_attn_decode_w4 PROPERTIES SKIP_RETURN_CODE 77
                       TIMEOUT 600 LABELS gpu ENVIRONMENT
                       "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive;TPI_ATTN_DEC_WARPS=4;TPI_ATTN_DEC_STAGES=3")
  add_test(NAME test_ops_cuda_attn_decode_w4_nocluster COMMAND test_ops_cuda_elem attn_decode)
  set_tests_properties(test_ops_cuda_attn_decode_w4_nocluster PROPERTIES SKIP_RETURN_CODE 77
                       TIMEOUT 600 LABELS gpu ENVIRONMENT
                       "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive;TPI_ATTN_DEC_WARPS=4;TPI_ATTN_DEC_CLUSTER=0")
  # the decode attention's tiles copied before its wait at every depth (the default:
  # right after it): the batch's rows put into the early tiles from registers
  add_test(NAME test_ops_cuda_attn_decode_pre COMMAND test_ops_cuda_elem attn_decode)
  set_tests_properties(test_ops_cuda_attn_decode_pre PROPERTIES SKIP_RETURN_CODE 77
                       TIMEOUT 600 LABELS gpu ENVIRONMENT
                       "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive;TPI_ATTN_DEC_PRE=1048576")
  # ... before it under 2048 positions, right after it from there (both orders in a run)
  add_test(NAME test_ops_cuda_attn_decode_prew COMMAND test_ops_cuda_elem attn_decode)
  set_tests_properties(test_ops_cuda_attn_decode_prew PROPERTIES SKIP_RETURN_CODE 77
                       TIMEOUT 600 LABELS gpu ENVIRONMENT
                       "CK_FORK=no;CK_DEFAULT_TIMEOUT=600;OMP_WAIT_POLICY=passive;TPI_ATTN_DEC_PRE=2048")
endif()
