// Token embedding lookup.
#pragma once

#include "engine/runtime/tensor.h"

namespace switchyard {

// ids: (n) i32, table: (vocab, hidden) -> out: (n, hidden). A negative id (a token
// whose row another vocabulary-parallel rank holds) gives a zero row and no gradient.
void embedding_forward(Device& dev, const Tensor& ids, const Tensor& table, Tensor& out);
// dtable accumulated (rows of repeated ids add up).
void embedding_backward(Device& dev, const Tensor& ids, const Tensor& dout, Tensor& dtable);

}  // namespace switchyard
