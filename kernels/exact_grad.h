// Exact sums of gradient parts, for runtime.batch_invariant (docs/determinism.md): each
// micro-batch's gradient of a parameter is added into its ledger as integers, so the sum
// over micro-batches and ranks has the same bits in every order and under every
// data-, expert-parallel and ZeRO layout. kernels/cpu/exact_grad.h has the number format.
// CPU only, as the mode is.
#pragma once

#include <cstdint>

#include "core/runtime/tensor.h"

namespace switchyard {

// The i64 elements of the ledger of an n-element gradient: a pair per element, then two
// fault counts (parts that were NaN; infinite or of magnitude 2^32 or more).
int64_t exact_grad_ledger_size(int64_t n);
// ledger += part (f32).
void exact_grad_add(Device& dev, const Tensor& part, Tensor& ledger);
// out (f32) = the ledger's sums, each rounded once (NaN or +infinity throughout where a
// part was not finite or out of range).
void exact_grad_read(Device& dev, const Tensor& ledger, Tensor& out);

}  // namespace switchyard
