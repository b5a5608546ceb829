// Token permutation for expert computation: rows of x are copied into one buffer
// grouped by expert, and the expert outputs are combined back into token order.
#pragma once

#include "core/runtime/tensor.h"

namespace switchyard {

// expert_ids: (n, k) i32, -1 for an assignment that is not sent (GShard's second
// expert), weights: (n, k) f32. capacity < 0 means dropless; otherwise
// each expert keeps at most `capacity` assignments, those with the largest router
// weight (ties: lower token index first), and the others are dropped.
// Outputs: tokens_per_expert: (E) i32; dest_rows: (n, k) i32, the row of the permuted
// buffer that holds assignment (t, j), or -1 when it was dropped. Within one expert's
// block rows are in token order, so the layout is deterministic.
void permute_plan(Device& dev, const Tensor& expert_ids, const Tensor& weights, int num_experts,
                  int64_t capacity, Tensor& tokens_per_expert, Tensor& dest_rows);

// Expert parallelism: the rows a rank receives come by source rank, then by local expert,
// counts[i, e] of them from source i for local expert e (counts: (sources, experts) i32,
// on `dev`). regroup: (R, 1) i32 written, R = the counts' sum: each received row's place
// when the rows are ordered by local expert, then source (arrival order kept within
// each), i.e. the dest_rows of a permute_gather into expert order. At most
// kMaxRegroupCounts counts.
inline constexpr int64_t kMaxRegroupCounts = 4096;
void regroup_received_rows(Device& dev, const Tensor& counts, Tensor& regroup);

// The rows moved (x, xp, dx, dxp, yp, y, dy, dyp) are f32 or bf16, one dtype per call;
// dest_rows is i32 and the combine weights and their gradients f32. With bf16 rows the
// arithmetic runs in f32 and each stored element is rounded once: a gather copies rows
// exactly, an accumulated bf16 dx is read, added to in f32 and rounded once.

// xp[dest_rows[t, j]] = x[t] for every kept assignment. x: (n, H), xp: (R, H).
void permute_gather(Device& dev, const Tensor& x, const Tensor& dest_rows, Tensor& xp);
// dx[t] += sum_j dxp[dest_rows[t, j]] (accumulated).
void permute_gather_backward(Device& dev, const Tensor& dxp, const Tensor& dest_rows, Tensor& dx);

// y[t] = sum over kept j of weights[t, j] * yp[dest_rows[t, j]] (written; a token with
// every assignment dropped gets zeros). yp: (R, H), y: (n, H), weights: (n, k) f32.
void unpermute_combine(Device& dev, const Tensor& yp, const Tensor& dest_rows,
                       const Tensor& weights, Tensor& y);
// dyp[dest[t, j]] = weights[t, j] * dy[t] (written, every row of dyp);
// dweights[t, j] = dot(dy[t], yp[dest[t, j]]), 0 when dropped (written, f32).
void unpermute_combine_backward(Device& dev, const Tensor& dy, const Tensor& yp,
                                const Tensor& dest_rows, const Tensor& weights, Tensor& dyp,
                                Tensor& dweights);

}  // namespace switchyard
