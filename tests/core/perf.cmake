# Regression tests for the simulator's fast paths (radix TopK, O(n) ITF voting, ...): each is
# checked against a straightforward reference implementation of the same contract.
kvtier_add_test(NAME itf_fast_test SOURCES itf_fast_test.cc LIBS kvtier_core LABELS unit)
kvtier_add_test(NAME tiered_cache_ref_test SOURCES tiered_cache_ref_test.cc
                LIBS kvtier_core LABELS unit)
# The same tests on ITF's portable path: core/itf.cc compiled again without AVX-512. With
# -march=native (KVTIER_NATIVE) a machine whose CPU has AVX-512 builds only the vector path, so
# without this binary the scalar fallback a user's CPU may take would never run in the suite.
# Its objects come first at link time, so the library's itf.o is not pulled in.
add_executable(itf_fast_portable_test itf_fast_test.cc ${PROJECT_SOURCE_DIR}/core/itf.cc)
target_compile_options(itf_fast_portable_test PRIVATE -mno-avx512f)
target_link_libraries(itf_fast_portable_test PRIVATE kvtier_core GTest::gtest GTest::gtest_main)
target_include_directories(itf_fast_portable_test PRIVATE ${PROJECT_SOURCE_DIR})
gtest_discover_tests(itf_fast_portable_test TEST_PREFIX "portable."
  PROPERTIES LABELS unit
             ENVIRONMENT "KVTIER_SOURCE_DIR=${PROJECT_SOURCE_DIR};KVTIER_BINARY_DIR=${PROJECT_BINARY_DIR}"
  DISCOVERY_TIMEOUT 60)
