# Config loading and option validation on temporary INI trees.
kvtier_add_test(NAME config_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/config_test.cc
  LIBS kvtier_core
  LABELS unit)
