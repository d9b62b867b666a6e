# Sources of the cache policies, TieredCache, ITF/H2O selection and the next-layer prediction.
list(APPEND KVTIER_CORE_POLICY_SOURCES
  cache_policy.cc
  tiered_cache.cc
  itf.cc
  prefetch.cc
)
