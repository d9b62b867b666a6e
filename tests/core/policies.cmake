# Tests of the cache policies, TieredCache, ITF and the next-layer prediction.
kvtier_add_test(NAME cache_policy_test SOURCES cache_policy_test.cc
                LIBS kvtier_core LABELS unit)
kvtier_add_test(NAME tiered_cache_test SOURCES tiered_cache_test.cc
                LIBS kvtier_core LABELS unit)
kvtier_add_test(NAME tiered_cache_contract_test SOURCES tiered_cache_contract_test.cc
                LIBS kvtier_core LABELS contract)
kvtier_add_test(NAME itf_test SOURCES itf_test.cc
                LIBS kvtier_core LABELS unit)
kvtier_add_test(NAME prefetch_test SOURCES prefetch_test.cc
                LIBS kvtier_core LABELS unit)
