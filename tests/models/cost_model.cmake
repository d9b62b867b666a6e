# Cost model tests (hand calculations); see tests/CMakeLists.txt for kvtier_add_test.
kvtier_add_test(NAME cost_model_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cost_model_test.cc
  LIBS kvtier_cost
  LABELS unit)
