// Internal invariants. A failed CHECK is a bug in the engine, not a user error: it
// prints file:line and aborts. User-caused errors travel as absl::Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace switchyard::internal {
[[noreturn]] inline void check_failed(const char* file, int line, const char* expr,
                                      const char* message) {
  std::fprintf(stderr, "switchyard: internal error at %s:%d: CHECK(%s) failed%s%s\n", file,
               line, expr, message[0] ? ": " : "", message);
  std::abort();
}
}  // namespace switchyard::internal

#define SY_CHECK(cond)                                                           \
  do {                                                                           \
    if (!(cond)) ::switchyard::internal::check_failed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define SY_CHECK_MSG(cond, msg)                                                    \
  do {                                                                             \
    if (!(cond)) ::switchyard::internal::check_failed(__FILE__, __LINE__, #cond, msg); \
  } while (0)
