# Tests of the cache policies, TieredCache, ITF and the prefetch ledger.
