// Internal invariants: a failure is a compiler bug, reported with file:line, then abort.
#pragma once
#include <cstdio>
#include <cstdlib>

#define EPL_ASSERT(cond, msg)                                                                      \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "internal error: %s\n  at %s:%d (%s)\n", msg, __FILE__, __LINE__,       \
                   #cond);                                                                         \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)
