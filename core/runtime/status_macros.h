// Propagation helpers for absl::Status / absl::StatusOr.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SY_CONCAT_INNER(a, b) a##b
#define SY_CONCAT(a, b) SY_CONCAT_INNER(a, b)

#define SY_RETURN_IF_ERROR(expr)            \
  do {                                      \
    ::absl::Status sy_status_ = (expr);     \
    if (!sy_status_.ok()) return sy_status_; \
  } while (0)

#define SY_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(*tmp)

#define SY_ASSIGN_OR_RETURN(lhs, expr) \
  SY_ASSIGN_OR_RETURN_IMPL(SY_CONCAT(sy_statusor_, __LINE__), lhs, expr)
