# Regression tests for the simulator's fast paths (radix TopK, O(n) ITF voting, ...): each is
# checked against a straightforward reference implementation of the same contract.
kvtier_add_test(NAME itf_fast_test SOURCES itf_fast_test.cc LIBS kvtier_core LABELS unit)
kvtier_add_test(NAME tiered_cache_ref_test SOURCES tiered_cache_ref_test.cc
                LIBS kvtier_core LABELS unit)
# The same tests on ITF's other paths: core/itf.cc compiled again without AVX-512 (its AVX2
# path, on a CPU with AVX2) and without AVX2 either (the scalar fallback). With -march=native
# (KVTIER_NATIVE) a machine builds only the widest path its CPU has, so without these binaries
# the paths a user's CPU may take would never run in the suite. Their objects come first at
# link time, so the library's itf.o is not pulled in.
foreach(variant IN ITEMS avx2 portable)
  add_executable(itf_fast_${variant}_test itf_fast_test.cc ${PROJECT_SOURCE_DIR}/core/itf.cc)
  target_link_libraries(itf_fast_${variant}_test PRIVATE kvtier_core GTest::gtest
                                                         GTest::gtest_main)
  target_include_directories(itf_fast_${variant}_test PRIVATE ${PROJECT_SOURCE_DIR})
  gtest_discover_tests(itf_fast_${variant}_test TEST_PREFIX "${variant}."
    PROPERTIES LABELS unit
               ENVIRONMENT "KVTIER_SOURCE_DIR=${PROJECT_SOURCE_DIR};KVTIER_BINARY_DIR=${PROJECT_BINARY_DIR}"
    DISCOVERY_TIMEOUT 60)
endforeach()
target_compile_options(itf_fast_avx2_test PRIVATE -mno-avx512f)
target_compile_options(itf_fast_portable_test PRIVATE -mno-avx512f -mno-avx2)
