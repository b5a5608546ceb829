// CUDA token permutation kernels (twins of kernels/cpu/permute.h): the dispatch plan, the
// gather into expert order and the weighted combine back. Assignment a = t * k + j is
// token t's j-th routed expert. Every pointer is device memory. Router weights and their
// gradients are fp32; the rows moved are templates on the element type, float or
// __nv_bfloat16: rows are loaded as float, sums run in float and each stored element is
// rounded once. Row indices read from dest_rows are checked on the device (a row outside
// [-1, permuted_rows) stops the kernel).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// expert_ids: (n, k) in [-1, E) (checked on the device), weights: (n, k), read only when
// capacity >= 0 -> tokens_per_expert: (E) kept counts, dest_rows: (n, k), the same plan
// as the CPU kernel. Each assignment gets a key (its expert, or E when it is not sent or
// dropped) and a stable radix sort of the assignments by key lays the permuted buffer out:
// expert blocks in expert order, token order inside each. With a capacity, an earlier
// stable sort by (expert, weight descending) ranks each expert's assignments and the
// ranks past the capacity are dropped.
void permute_plan(const int32_t* expert_ids, const float* weights, int64_t n, int k,
                  int num_experts, int64_t capacity, int32_t* tokens_per_expert, int32_t* dest_rows,
                  cudaStream_t stream);

// Expert parallelism's regrouping of received rows (kernels/permute.h): counts:
// (sources, experts) -> regroup: (rows) places. Each block lays the counts out in shared
// memory (at most 4096 of them), then each thread finds its rows' blocks by binary search.
// Counts not adding up to `rows` stop the kernel.
void regroup_received_rows(const int32_t* counts, int sources, int experts, int64_t rows,
                           int32_t* regroup, cudaStream_t stream);

// xp[dest_rows[t, j]] = x[t] for every kept assignment; x: (n, hidden), xp:
// (permuted_rows, hidden).
template <typename T>
void permute_gather(const T* x, const int32_t* dest_rows, T* xp, int64_t n, int k, int64_t hidden,
                    int64_t permuted_rows, cudaStream_t stream);
// dx[t] += sum over kept j of dxp[dest_rows[t, j]], in j order.
template <typename T>
void permute_gather_backward(const T* dxp, const int32_t* dest_rows, T* dx, int64_t n, int k,
                             int64_t hidden, int64_t permuted_rows, cudaStream_t stream);
// y[t] = sum over kept j of weights[t, j] * yp[dest_rows[t, j]], in j order (written).
template <typename T>
void unpermute_combine(const T* yp, const int32_t* dest_rows, const float* weights, T* y, int64_t n,
                       int k, int64_t hidden, int64_t permuted_rows, cudaStream_t stream);
// dyp: (permuted_rows, hidden) written, zero on rows no assignment maps to;
// dweights[t, j] = dot(dy[t], yp[dest_rows[t, j]]), 0 when dropped (one block per
// assignment, a fixed-order block sum).
template <typename T>
void unpermute_combine_backward(const T* dy, const T* yp, const int32_t* dest_rows,
                                const float* weights, T* dyp, float* dweights, int64_t n, int k,
                                int64_t hidden, int64_t permuted_rows, cudaStream_t stream);

}  // namespace switchyard::cuda
