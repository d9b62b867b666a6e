# HwExecutor, `kvtier calibrate` and `kvtier hw` tests (host backend on the real disk; GPU tests
# skip without a device). Included from tests/hw/CMakeLists.txt.
kvtier_add_test(NAME hw_executor_test SOURCES hw_executor_test.cc
                LIBS kvtier_hw kvtier_testutil LABELS unit)
kvtier_add_test(NAME hw_executor_gpu_test SOURCES hw_executor_gpu_test.cc
                LIBS kvtier_hw kvtier_testutil LABELS gpu)
kvtier_add_test(NAME hw_cli_test SOURCES hw_cli_test.cc LIBS kvtier_core kvtier_cost LABELS unit)
kvtier_add_test(NAME hw_run_test SOURCES hw_run_test.cc LIBS kvtier_core kvtier_results LABELS slow)
foreach(t hw_cli_test hw_run_test)
  add_dependencies(${t} kvtier)
  target_compile_definitions(${t} PRIVATE KVTIER_CLI="$<TARGET_FILE:kvtier>")
endforeach()
kvtier_add_test(NAME hw_device_backend_test SOURCES device_backend_test.cc
                LIBS kvtier_hw kvtier_testutil LABELS unit)
kvtier_add_test(NAME hw_cake_test SOURCES hw_cake_test.cc
                LIBS kvtier_hw kvtier_testutil LABELS unit)
