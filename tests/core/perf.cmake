# Regression tests for the simulator's fast paths (radix TopK, O(n) ITF voting, ...): each is
# checked against a straightforward reference implementation of the same contract.
kvtier_add_test(NAME itf_fast_test SOURCES itf_fast_test.cc LIBS kvtier_core LABELS unit)
kvtier_add_test(NAME tiered_cache_ref_test SOURCES tiered_cache_ref_test.cc
                LIBS kvtier_core LABELS unit)
