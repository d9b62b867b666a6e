# Tests of the radix tree and the Pipeline (over FakeExecutor).
kvtier_add_test(NAME radix_tree_test SOURCES radix_tree_test.cc LIBS kvtier_core LABELS unit)
kvtier_add_test(NAME pipeline_test SOURCES pipeline_test.cc LIBS kvtier_testutil LABELS unit)
kvtier_add_test(NAME reorderer_test SOURCES reorderer_test.cc LIBS kvtier_core LABELS unit)
