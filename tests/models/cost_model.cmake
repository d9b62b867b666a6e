# Cost model tests (hand calculations); see tests/CMakeLists.txt for kvtier_add_test.
kvtier_add_test(NAME cost_model_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cost_model_test.cc
  LIBS kvtier_cost
  LABELS unit)

# Measured layer tables and ComputeTimer (models/layer_table.h); the path test loads configs/.
kvtier_add_test(NAME layer_table_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/layer_table_test.cc
  LIBS kvtier_cost
  LABELS unit)
target_compile_definitions(layer_table_test PRIVATE
                           KVTIER_SOURCE_DIR_FALLBACK="${PROJECT_SOURCE_DIR}")
