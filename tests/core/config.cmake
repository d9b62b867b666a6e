# Config loading and option validation on temporary INI trees.
kvtier_add_test(NAME config_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/config_test.cc
  LIBS kvtier_core
  LABELS unit)
# hw.fault_injection's plan syntax (core/fault_plan.h).
kvtier_add_test(NAME fault_plan_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/fault_plan_test.cc
  LIBS kvtier_core
  LABELS unit)
