// Token embedding lookup.
#pragma once

#include "core/runtime/tensor.h"

namespace switchyard {

// ids: (n) i32, table: (vocab, hidden) -> out: (n, hidden), table and out both f32 or both
// bf16 (rows are copied exactly). A negative id (a token whose row another
// vocabulary-parallel rank holds) gives a zero row and no gradient.
void embedding_forward(Device& dev, const Tensor& ids, const Tensor& table, Tensor& out);
// dtable (f32) accumulated: dout rows (f32 or bf16) added in f32, repeated ids adding up.
void embedding_backward(Device& dev, const Tensor& ids, const Tensor& dout, Tensor& dtable);

}  // namespace switchyard
