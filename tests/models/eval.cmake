# Tests for models/recorder.* and models/eval.* (kvtier trace record, kvtier eval). Included from
# tests/models/CMakeLists.txt.
kvtier_add_test(NAME models_recorder_eval_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/recorder_eval_test.cc
                LIBS kvtier_models_testlib LABELS unit)
target_compile_definitions(models_recorder_eval_test PRIVATE
                           KVTIER_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# The built binary: bad input (unit, no model needed) and the real SmolLM2 (slow; skips without
# the model): record -> trace stats -> sim, eval on PIQA.
kvtier_add_test(NAME models_record_eval_cli_test
                SOURCES ${CMAKE_CURRENT_LIST_DIR}/record_eval_cli_test.cc
                LIBS SQLite::SQLite3 kvtier_models_testlib LABELS unit)
kvtier_add_test(NAME models_record_eval_smollm2_test
                SOURCES ${CMAKE_CURRENT_LIST_DIR}/record_eval_smollm2_test.cc LIBS SQLite::SQLite3
                LABELS slow)
foreach(t models_record_eval_cli_test models_record_eval_smollm2_test)
  target_compile_definitions(${t} PRIVATE KVTIER_BIN="$<TARGET_FILE:kvtier>"
                             KVTIER_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  add_dependencies(${t} kvtier)
endforeach()
