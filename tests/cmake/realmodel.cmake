# Checks with the real Qwen2.5-Coder-0.5B-Instruct Q4_K_M model (docs/MODELS.md, "Checks
# with the real model"): greedy answers, perplexity of a Debian licence text at three
# (tp,pp) layouts, and the chat template. Plain bash tests (tests/test_realmodel.sh) that
# run the tpinfer binary; exit 77 = skipped when the model is not in the cache (the tests
# never download it: launch/setup.sh's demo fetches it before CI runs the tests).
# A 0.5B model at -O0 under ASan would take many minutes per test: the sanitizer and
# Debug builds (.ci/extra.sh) leave these out; the Release build runs them.
if(TPI_SANITIZE OR CMAKE_BUILD_TYPE STREQUAL "Debug")
  message(STATUS "tests: real-model checks left out of this ${CMAKE_BUILD_TYPE} build"
                 " (TPI_SANITIZE=${TPI_SANITIZE}); they run in a Release build")
  return()
endif()
set(_realmodel_sh ${CMAKE_SOURCE_DIR}/tests/test_realmodel.sh)
set(_realmodel_env "OMP_WAIT_POLICY=passive;OMPI_MCA_rmaps_base_oversubscribe=1")

# capital of France -> Paris, largest planet -> Jupiter, gold -> Au, a Python adder -> def
add_test(NAME realmodel_answers COMMAND bash ${_realmodel_sh} answers ${CMAKE_SOURCE_DIR}
         $<TARGET_FILE:tpinfer>)
# PPL of the first 1,024 tokens of /usr/share/common-licenses/Apache-2.0, each layout
# within |d ln PPL| < 0.005 of the measured reference (so within 0.01 of each other)
add_test(NAME realmodel_ppl_tp1pp1 COMMAND bash ${_realmodel_sh} perplexity ${CMAKE_SOURCE_DIR}
         $<TARGET_FILE:tpinfer> ${MPIEXEC_EXECUTABLE} 1 1)
add_test(NAME realmodel_ppl_tp2pp1 COMMAND bash ${_realmodel_sh} perplexity ${CMAKE_SOURCE_DIR}
         $<TARGET_FILE:tpinfer> ${MPIEXEC_EXECUTABLE} 2 1)
add_test(NAME realmodel_ppl_tp1pp2 COMMAND bash ${_realmodel_sh} perplexity ${CMAKE_SOURCE_DIR}
         $<TARGET_FILE:tpinfer> ${MPIEXEC_EXECUTABLE} 1 2)
# system + user chat: prompt ids = the tokens of the GGUF template's rendering
add_test(NAME realmodel_chat COMMAND bash ${_realmodel_sh} chat ${CMAKE_SOURCE_DIR}
         $<TARGET_FILE:tpinfer>)
# user-only chat: Qwen2.5's template then adds its default system prompt ("You are Qwen,
# created by Alibaba Cloud. ..."), and so does engine/text/chat.c (it takes the default
# from the template's own text).
add_test(NAME realmodel_chat_default_system COMMAND bash ${_realmodel_sh} chat-default-system
         ${CMAKE_SOURCE_DIR} $<TARGET_FILE:tpinfer>)

set(_realmodel_tests realmodel_answers realmodel_ppl_tp1pp1 realmodel_ppl_tp2pp1
    realmodel_ppl_tp1pp2 realmodel_chat realmodel_chat_default_system)
set_tests_properties(${_realmodel_tests} PROPERTIES LABELS unit SKIP_RETURN_CODE 77
                     TIMEOUT 180 ENVIRONMENT "${_realmodel_env}")
# The two-rank layouts take both cores; run them one at a time (and never beside each
# other), so that CI's ctest -j 2 does not oversubscribe them further.
set_tests_properties(realmodel_ppl_tp2pp1 realmodel_ppl_tp1pp2 PROPERTIES
                     RESOURCE_LOCK tpi_realmodel_mpi)
