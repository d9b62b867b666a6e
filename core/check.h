#pragma once
// Invariant checks. KVTIER_CHECK is always on; KVTIER_DCHECK is on when KVTIER_ENABLE_DCHECK
// is defined (the default build keeps it on). A failure prints file, line, the condition and
// the message, then aborts: it means a bug in kvtier, never bad input (use InputError there).

#include <cstdio>
#include <cstdlib>

#define KVTIER_CHECK(cond, msg)                                                      \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: invariant violated: %s: %s\n", __FILE__, __LINE__, \
                   #cond, (msg));                                                    \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)

#if defined(KVTIER_ENABLE_DCHECK)
#define KVTIER_DCHECK(cond, msg) KVTIER_CHECK(cond, msg)
#else
#define KVTIER_DCHECK(cond, msg) \
  do {                           \
  } while (0)
#endif
