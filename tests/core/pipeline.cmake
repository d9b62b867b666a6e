# Tests of the radix tree and the Pipeline (over FakeExecutor).
kvtier_add_test(NAME radix_tree_test SOURCES radix_tree_test.cc LIBS kvtier_core LABELS unit)
kvtier_add_test(NAME pipeline_test SOURCES pipeline_test.cc LIBS kvtier_testutil LABELS unit)
kvtier_add_test(NAME pipeline_failure_test SOURCES pipeline_failure_test.cc LIBS kvtier_testutil
                LABELS unit contract)
target_compile_definitions(pipeline_failure_test PRIVATE
                           KVTIER_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}")  # configs/systems
kvtier_add_test(NAME stored_layout_test SOURCES stored_layout_test.cc LIBS kvtier_core LABELS unit)
kvtier_add_test(NAME reorderer_test SOURCES reorderer_test.cc LIBS kvtier_core LABELS unit)
kvtier_add_test(NAME executor_wrapper_test SOURCES executor_wrapper_test.cc LIBS kvtier_testutil
                LABELS unit contract)
target_compile_definitions(executor_wrapper_test PRIVATE
                           KVTIER_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}")  # configs/systems
kvtier_add_test(NAME op_graph_test SOURCES op_graph_test.cc LIBS kvtier_core LABELS unit contract)
kvtier_add_test(NAME transfer_strategy_test SOURCES transfer_strategy_test.cc LIBS kvtier_testutil
                LABELS unit contract)
target_compile_definitions(transfer_strategy_test PRIVATE
                           KVTIER_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}")  # configs/systems
kvtier_add_test(NAME decode_test SOURCES decode_test.cc LIBS kvtier_testutil LABELS unit)
