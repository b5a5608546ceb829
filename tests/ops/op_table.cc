// The entries of the op table (tests/ops/op_table.h), one per op (the router's in
// tests/ops/routing_entries.cc).
#include "tests/ops/op_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

#include "core/runtime/rng.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/columns.h"
#include "kernels/convert.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/columns.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/permute.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/permute.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "tests/bf16_test_util.h"
#include "tests/ops/op_entries.h"
#include "tests/tensor_test_util.h"

namespace switchyard::testing {

OpResult result(const std::string& name, const Tensor& t, Match match) {
  return OpResult{name, match, t.dtype(), false, as_doubles(t)};
}

OpResult result(const std::string& name, const std::vector<double>& sums) {
  return OpResult{name, Match::kClose, DType::kF32, true, sums};
}

Tensor OpRun::written(const Shape& shape, DType dtype) const {
  return poisoned(device_, shape, dtype);
}

Tensor OpRun::updated(size_t i) const {
  const Tensor& source = in(i);
  Tensor copy = Tensor::empty(source.shape(), source.dtype(), MemoryKind::kOther, source.device());
  copy.copy_from(source);
  return copy;
}

// Rounded to nearest even in double arithmetic: a quantum of 2^(e - 8) for x = m 2^e
// (8 significant bits), 2^-133 below the normal range (bf16's subnormals); past the
// largest bf16 an infinity.
double bf16_rounded(double x) {
  if (!std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);
  const double quantum = std::ldexp(1.0, std::max(e - 8, -133));
  const double rounded = std::nearbyint(x / quantum) * quantum;
  const double largest = std::ldexp(255.0 / 128.0, 127);
  return std::abs(rounded) > largest ? std::copysign(INFINITY, x) : rounded;
}

double stored(double x, DType dtype) {
  if (dtype == DType::kBF16) return bf16_rounded(x);
  return dtype == DType::kF32 ? static_cast<double>(static_cast<float>(x)) : x;
}

const std::vector<std::vector<DType>> kTwoDtypes = {
    {kF32, kF32}, {kF32, kBF16}, {kBF16, kF32}, {kBF16, kBF16}};
const std::vector<std::vector<DType>> kOneDtype = {{kF32}, {kBF16}};

Tensor input(const Shape& shape, DType dtype, uint64_t seed, const OpCase& c, double lo,
             double hi) {
  const Tensor f = c.integers
                       ? integer_tensor(shape, seed, static_cast<int>(lo), static_cast<int>(hi))
                       : random_tensor(shape, seed, lo, hi);
  return to_dtype(f, dtype);
}

double value_range(const OpCase& c) { return c.integers ? 4 : 1; }

std::vector<double> copy(const std::vector<double>& v) { return v; }

std::vector<int32_t> as_ids(const std::vector<double>& v) {
  return std::vector<int32_t>(v.begin(), v.end());
}

Tensor expert_ids(int64_t n, int64_t k, int64_t experts, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(n * k);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.below(experts + 1)) - 1;
  return host_tensor({n, k}, ids);
}

namespace {

// y += alpha x and x *= alpha, each from the same inputs. The largest size runs past one
// grid of GPU blocks, through the grid-stride loops.
constexpr float kAddAlpha = 0.37f, kScaleAlpha = -1.7f;

OpEntry add_and_scale() {
  OpEntry e;
  e.name = "add_and_scale";
  e.dims = {{0}, {1}, {1000003}, {(int64_t{1} << 24) + 4099}};
  e.dtypes = kOneDtype;
  e.inputs = [](const OpCase& c) {
    return std::vector<Tensor>{input(c.dims, c.dtypes[0], 1, c),
                               input(c.dims, c.dtypes[0], 2, c, -3, 3)};
  };
  e.run = [](const OpRun& r, const OpCase&) {
    Tensor sum = r.updated(0), scaled = r.updated(0);
    add_(r.device(), sum, r.in(1), kAddAlpha);
    scale_(r.device(), scaled, kScaleAlpha);
    return std::vector<OpResult>{result("y + alpha x", sum), result("alpha y", scaled)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    std::vector<double> sum = copy(in[0]), scaled = copy(in[0]);
    cpu::add<double>(sum.data(), in[1].data(), kAddAlpha, c.dims[0]);
    cpu::scale<double>(scaled.data(), kScaleAlpha, c.dims[0]);
    return Values{sum, scaled};
  };
  return e;
}

// dims (rows, n): rows around the GPU's column-sum chunking (one, a partial chunk, many
// chunks). dtypes (y and dy, bias); dbias is f32, accumulated onto.
OpEntry bias() {
  OpEntry e;
  e.name = "bias";
  e.dims = {{0, 77}, {1, 77}, {33, 77}, {1000, 77}, {70001, 77}};
  e.dtypes = kTwoDtypes;
  e.inputs = [](const OpCase& c) {
    const int64_t rows = c.dims[0], n = c.dims[1];
    return std::vector<Tensor>{input({rows, n}, c.dtypes[0], 3, c), input({n}, c.dtypes[1], 4, c),
                               input({rows, n}, c.dtypes[0], 5, c), input({n}, kF32, 6, c)};
  };
  e.run = [](const OpRun& r, const OpCase&) {
    Tensor y = r.updated(0), dbias = r.updated(3);
    add_bias_(r.device(), y, r.in(1));
    bias_backward(r.device(), r.in(2), dbias);
    return std::vector<OpResult>{result("y + bias", y), result("dbias", dbias, Match::kSum)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    std::vector<double> y = copy(in[0]), dbias = copy(in[3]);
    cpu::add_bias<double>(y.data(), in[1].data(), c.dims[0], c.dims[1]);
    cpu::bias_backward<double>(in[2].data(), dbias.data(), c.dims[0], c.dims[1]);
    return Values{y, dbias};
  };
  e.gradient_dims = {{3, 5}};
  e.loss_result = 0;
  e.upstream = 2;
  e.gradients = {{1, 1, 3}};
  return e;
}

// y[r] += sigmoid(g[r]) x[r] and its backward. dims (rows, n); dtypes (x, y, dy and dx;
// g and dg). The gates span the sigmoid's saturation.
OpEntry sigmoid_gate() {
  OpEntry e;
  e.name = "sigmoid_gate";
  e.dims = {{0, 129}, {1, 129}, {37, 129}, {300, 129}, {33, 77}, {1000, 77}, {70001, 77}};
  e.dtypes = kTwoDtypes;
  e.inputs = [](const OpCase& c) {
    const int64_t rows = c.dims[0], n = c.dims[1];
    return std::vector<Tensor>{
        input({rows, n}, c.dtypes[0], 7, c), input({rows, 1}, c.dtypes[1], 8, c, -6, 6),
        input({rows, n}, c.dtypes[0], 9, c), input({rows, n}, c.dtypes[0], 10, c)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t rows = c.dims[0], n = c.dims[1];
    Tensor y = r.updated(2);
    sigmoid_gate_forward(r.device(), r.in(0), r.in(1), y);
    Tensor dx = r.written({rows, n}, c.dtypes[0]), dg = r.written({rows, 1}, c.dtypes[1]);
    sigmoid_gate_backward(r.device(), r.in(3), r.in(0), r.in(1), dx, dg);
    return std::vector<OpResult>{result("y", y), result("dx", dx), result("dg", dg, Match::kSum)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t rows = c.dims[0], n = c.dims[1];
    std::vector<double> y = copy(in[2]), dx(rows * n), dg(rows);
    cpu::sigmoid_gate_forward<double>(in[0].data(), in[1].data(), y.data(), rows, n);
    cpu::sigmoid_gate_backward<double>(in[3].data(), in[0].data(), in[1].data(), dx.data(),
                                       dg.data(), rows, n);
    return Values{y, dx, dg};
  };
  e.gradient_dims = {{3, 5}};
  e.loss_result = 0;
  e.upstream = 3;
  e.gradients = {{0, 1}, {1, 2}};
  return e;
}

// Sums of squares of a list of tensors (dims: their sizes) at once, and of each alone:
// the same kernels, so the same sums bit for bit.
OpEntry sum_squares_entry() {
  OpEntry e;
  e.name = "sum_squares";
  e.dims = {{0}, {1}, {257}, {5000011}, {257, 0, 1, 1000003, 64}};
  e.dtypes = kOneDtype;
  e.inputs = [](const OpCase& c) {
    std::vector<Tensor> xs;
    for (size_t i = 0; i < c.dims.size(); ++i)
      xs.push_back(input({c.dims[i]}, c.dtypes[0], 20 + i, c, -3, 3));
    return xs;
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    std::vector<Tensor> xs;
    std::vector<double> each;
    for (size_t i = 0; i < c.dims.size(); ++i) {
      xs.push_back(r.in(i));
      each.push_back(sum_squares(r.device(), r.in(i)));
    }
    return std::vector<OpResult>{result("together", sum_squares(r.device(), xs)),
                                 result("each alone", each)};
  };
  e.reference = [](const Values& in, const OpCase&) {
    std::vector<double> sums;
    for (const std::vector<double>& x : in)
      sums.push_back(cpu::sum_squares<double>(x.data(), static_cast<int64_t>(x.size())));
    return Values{sums, sums};
  };
  e.invariant = [](const std::vector<OpResult>& results) {
    EXPECT_EQ(results[0].values, results[1].values) << "sums together and alone differ";
  };
  return e;
}

// The gradient norm's sums of squares, exact over rows: one tensor (dims: rows, row
// length), whole and split into two ranges of rows, whose sums added exactly must give
// the whole's bits (an expert or ZeRO row split leaves the norm alike). Rows of one
// element, rows far longer than a GPU block, more rows than one grid; no rows.
OpEntry row_sum_squares_entry() {
  OpEntry e;
  e.name = "row_sum_squares";
  e.dims = {{1, 1}, {3, 257}, {70000, 3}, {2, 1000003}, {0, 5}};
  e.dtypes = kOneDtype;
  e.inputs = [](const OpCase& c) {
    return std::vector<Tensor>{input({c.dims[0], c.dims[1]}, c.dtypes[0], 40, c, -3, 3)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t rows = c.dims[0], half = rows / 2;
    const Tensor& x = r.in(0);
    const std::vector<ExactSum> whole = row_sum_squares(r.device(), {x});
    std::vector<ExactSum> parts =
        row_sum_squares(r.device(), {x.slice_rows(0, half), x.slice_rows(half, rows)});
    parts[0].add(parts[1]);
    return std::vector<OpResult>{result("whole", {whole[0].value()}),
                                 result("two ranges of rows", {parts[0].value()})};
  };
  e.reference = [](const Values& in, const OpCase&) {
    const std::vector<double> sum{
        cpu::sum_squares<double>(in[0].data(), static_cast<int64_t>(in[0].size()))};
    return Values{sum, sum};
  };
  e.invariant = [](const std::vector<OpResult>& results) {
    EXPECT_EQ(results[0].values, results[1].values) << "whole and split rows differ";
  };
  return e;
}

// dims (rows, dim): dims below, above and far above a GPU block; more rows than one grid
// of blocks; no rows. dtypes (activations, weight); rstd and dweight are f32, dweight
// accumulated onto.
constexpr float kRmsEps = 1e-6f;

OpEntry rmsnorm() {
  OpEntry e;
  e.name = "rmsnorm";
  e.dims = {{67, 300}, {3, 4099}, {1, 1}, {70001, 8}, {0, 16}};
  e.dtypes = kTwoDtypes;
  e.inputs = [](const OpCase& c) {
    const int64_t rows = c.dims[0], dim = c.dims[1];
    return std::vector<Tensor>{input({rows, dim}, c.dtypes[0], 11, c, -2, 2),
                               input({dim}, c.dtypes[1], 12, c, 0.5, 1.5),
                               input({rows, dim}, c.dtypes[0], 13, c), input({dim}, kF32, 14, c)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t rows = c.dims[0], dim = c.dims[1];
    Tensor y = r.written({rows, dim}, c.dtypes[0]), rstd = r.written({rows});
    rmsnorm_forward(r.device(), r.in(0), r.in(1), kRmsEps, y, rstd);
    Tensor dx = r.written({rows, dim}, c.dtypes[0]), dweight = r.updated(3);
    rmsnorm_backward(r.device(), r.in(2), r.in(0), r.in(1), rstd, dx, dweight);
    return std::vector<OpResult>{result("y", y), result("rstd", rstd), result("dx", dx),
                                 result("dweight", dweight, Match::kSum)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t rows = c.dims[0], dim = c.dims[1];
    std::vector<double> y(rows * dim), rstd(rows), dx(rows * dim), dweight = copy(in[3]);
    cpu::rmsnorm_forward<double>(in[0].data(), in[1].data(), kRmsEps, rows, dim, y.data(),
                                 rstd.data());
    cpu::rmsnorm_backward<double>(in[2].data(), in[0].data(), in[1].data(), rstd.data(), rows, dim,
                                  dx.data(), dweight.data());
    return Values{y, rstd, dx, dweight};
  };
  e.gradient_dims = {{3, 7}};
  e.loss_result = 0;
  e.upstream = 2;
  e.gradients = {{0, 2}, {1, 3, 3}};
  return e;
}

// dims (rows, I): gate_up (rows, 2I) over the sigmoid's range, out (rows, I).
OpEntry swiglu() {
  OpEntry e;
  e.name = "swiglu";
  e.dims = {{0, 129}, {1, 129}, {37, 129}, {1000, 129}};
  e.dtypes = kOneDtype;
  e.inputs = [](const OpCase& c) {
    const int64_t rows = c.dims[0], inter = c.dims[1];
    return std::vector<Tensor>{input({rows, 2 * inter}, c.dtypes[0], 15, c, -8, 8),
                               input({rows, inter}, c.dtypes[0], 16, c)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t rows = c.dims[0], inter = c.dims[1];
    Tensor out = r.written({rows, inter}, c.dtypes[0]);
    swiglu_forward(r.device(), r.in(0), out);
    Tensor dgate_up = r.written({rows, 2 * inter}, c.dtypes[0]);
    swiglu_backward(r.device(), r.in(1), r.in(0), dgate_up);
    return std::vector<OpResult>{result("out", out), result("dgate_up", dgate_up)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t rows = c.dims[0], inter = c.dims[1];
    std::vector<double> out(rows * inter), dgate_up(rows * 2 * inter);
    cpu::swiglu_forward<double>(in[0].data(), out.data(), rows, inter);
    cpu::swiglu_backward<double>(in[1].data(), in[0].data(), dgate_up.data(), rows, inter);
    return Values{out, dgate_up};
  };
  e.gradient_dims = {{3, 5}};
  e.loss_result = 0;
  e.upstream = 1;
  e.gradients = {{0, 1}};
  return e;
}

// dims (batch, seq, heads, head_dim); the f32 table covers more positions than the
// sequence. x rotated forward, dy backward.
constexpr float kRopeTheta = 10000.0f;

OpEntry rope() {
  OpEntry e;
  e.name = "rope";
  e.dims = {{2, 37, 3, 66}, {1, 5, 1, 2}, {3, 129, 4, 128}, {0, 4, 2, 8}};
  e.dtypes = kOneDtype;
  e.inputs = [](const OpCase& c) {
    return std::vector<Tensor>{input(c.dims, c.dtypes[0], 17, c),
                               input(c.dims, c.dtypes[0], 18, c)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const Tensor table = rope_table(c.dims[1] + 3, c.dims[3], kRopeTheta).to(r.device());
    Tensor y = r.updated(0), dx = r.updated(1);
    rope_forward(r.device(), table, y);
    rope_backward(r.device(), table, dx);
    return std::vector<OpResult>{result("y", y), result("dx", dx)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t b = c.dims[0], s = c.dims[1], h = c.dims[2], d = c.dims[3];
    std::vector<double> table((s + 3) * d);
    cpu::rope_table<double>(s + 3, d, kRopeTheta, table.data());
    std::vector<double> y = copy(in[0]), dx = copy(in[1]);
    cpu::rope_forward<double>(table.data(), y.data(), b, s, h, d);
    cpu::rope_backward<double>(table.data(), dx.data(), b, s, h, d);
    return Values{y, dx};
  };
  e.gradient_dims = {{2, 3, 2, 4}};
  e.loss_result = 0;
  e.upstream = 1;
  e.gradients = {{0, 1}};
  return e;
}

// Causal attention with grouped KV heads, plain or over documents. dims (batch, seq,
// heads, kv_heads, head_dim, documents): head_dim 64 and 128 (the GPU's two tile widths),
// 40, 8 and 6 (zero-padded columns); seq 1, inside one tile and over several with a
// partial last one; 2 query heads per KV head, all on one, or one each; no batch.
// documents: none (0), or pattern d of kDocuments, cycled through each window from
// another start, so documents end inside and across the CPU's row blocks and the GPU's
// tiles (64 rows in bf16, 32 in f32), one of a single position among them, and whole key
// tiles are skipped. Inputs q, k, v, dout, the CPU forward's out and lse (which both
// backends' backwards read, so that they differ by their own arithmetic alone; the
// template's reads its own) and doc_starts. Results out, lse, dq, dk, dv, and the
// backward again: no atomics, so the same bits.
const std::vector<int64_t> kDocuments[] = {
    {}, {5, 1, 70, 3, 64}, {5, 1, 70, 3, 150}, {64, 1, 100, 31}, {1, 2, 3}};

Tensor document_starts(int64_t batch, int64_t seq, const std::vector<int64_t>& lengths) {
  const size_t n = lengths.size();
  std::vector<int32_t> starts;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t begin = 0;
    size_t doc = static_cast<size_t>(b);  // each window starts at another length
    for (int64_t i = 0; i < seq; ++i) {
      if (i == begin + lengths[doc % n]) begin += lengths[doc++ % n];
      starts.push_back(static_cast<int32_t>(begin));
    }
  }
  return host_tensor({batch, seq}, starts);
}

OpEntry attention() {
  OpEntry e;
  e.name = "attention";
  e.dims = {{2, 1, 4, 2, 64, 0},    {2, 17, 4, 2, 64, 0},   {2, 300, 4, 2, 64, 0},
            {2, 300, 4, 1, 64, 0},  {2, 1, 4, 1, 128, 0},   {2, 17, 4, 1, 128, 0},
            {2, 300, 4, 2, 128, 0}, {2, 300, 4, 1, 128, 0}, {1, 70, 6, 2, 40, 0},
            {3, 33, 2, 1, 8, 0},    {0, 5, 2, 1, 8, 0},     {2, 150, 4, 2, 6, 1},
            {1, 1, 2, 1, 8, 1},     {2, 130, 4, 4, 128, 1}, {0, 4, 2, 1, 8, 1},
            {2, 300, 4, 2, 64, 2},  {2, 300, 4, 1, 128, 3}, {3, 33, 2, 1, 8, 4}};
  e.dtypes = kOneDtype;
  e.inputs = [](const OpCase& c) {
    const int64_t b = c.dims[0], s = c.dims[1], h = c.dims[2], kv = c.dims[3], d = c.dims[4];
    const Tensor starts = c.dims[5] != 0 ? document_starts(b, s, kDocuments[c.dims[5]]) : Tensor();
    std::vector<Tensor> in{input({b, s, h, d}, c.dtypes[0], 60, c, -2, 2),
                           input({b, s, kv, d}, c.dtypes[0], 61, c, -2, 2),
                           input({b, s, kv, d}, c.dtypes[0], 62, c),
                           input({b, s, h, d}, c.dtypes[0], 63, c),
                           Tensor::empty({b, s, h, d}, c.dtypes[0]),
                           Tensor::empty({b, h, s})};
    attention_forward(cpu_device(), in[0], in[1], in[2], in[4], in[5], starts);
    if (starts.defined()) in.push_back(starts);
    return in;
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t b = c.dims[0], s = c.dims[1], h = c.dims[2], kv = c.dims[3], d = c.dims[4];
    const DType dtype = c.dtypes[0];
    const Tensor starts = c.dims[5] != 0 ? r.in(6) : Tensor();
    Tensor out = r.written({b, s, h, d}, dtype), lse = r.written({b, h, s});
    attention_forward(r.device(), r.in(0), r.in(1), r.in(2), out, lse, starts);
    std::vector<OpResult> results{result("out", out), result("lse", lse)};
    for (const char* pass : {"", " again"}) {
      Tensor dq = r.written({b, s, h, d}, dtype), dk = r.written({b, s, kv, d}, dtype),
             dv = r.written({b, s, kv, d}, dtype);
      attention_backward(r.device(), r.in(3), r.in(0), r.in(1), r.in(2), r.in(4), r.in(5), dq, dk,
                         dv, starts);
      results.insert(results.end(),
                     {result(std::string("dq") + pass, dq), result(std::string("dk") + pass, dk),
                      result(std::string("dv") + pass, dv)});
    }
    return results;
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const cpu::AttentionShape s{c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]};
    const std::vector<int32_t> starts = c.dims[5] != 0 ? as_ids(in[6]) : std::vector<int32_t>{};
    const int32_t* doc_starts = c.dims[5] != 0 ? starts.data() : nullptr;
    std::vector<double> out(in[0].size()), lse(s.batch * s.heads * s.seq), dq(in[0].size()),
        dk(in[1].size()), dv(in[2].size());
    cpu::attention_forward<double>(in[0].data(), in[1].data(), in[2].data(), s, out.data(),
                                   lse.data(), doc_starts);
    cpu::attention_backward<double>(in[3].data(), in[0].data(), in[1].data(), in[2].data(),
                                    out.data(), lse.data(), s, dq.data(), dk.data(), dv.data(),
                                    doc_starts);
    return Values{out, lse, dq, dk, dv, dq, dk, dv};
  };
  // Grouped-query heads, every query head on one KV head, and packed documents.
  e.gradient_dims = {{2, 9, 4, 2, 6, 0}, {1, 13, 4, 1, 5, 0}, {2, 9, 2, 1, 4, 1},
                     {2, 11, 4, 2, 5, 4}};
  e.loss_result = 0;
  e.upstream = 3;
  e.gradients = {{0, 2}, {1, 3}, {2, 4}};
  // f32: the backends differ in the order of their f32 sums. bf16: the GPU rounds the
  // probabilities (in [0, 1]) and the score gradients to bf16 as tensor-core operands, a
  // relative error of at most 2^-9 per term of the sums over keys or queries, which the
  // CPU does not; outputs with |x| < 1 are compared absolutely and stay within a few 2^-9;
  // a final rounding to the other side of a bf16 tie adds one ulp, 2^-7 relative at
  // most. 1/64 leaves room for both.
  e.tol.f32 = 1e-4;
  e.tol.bf16 = 1.0 / 64;
  e.invariant = [](const std::vector<OpResult>& results) {
    for (size_t i = 2; i < 5; ++i)
      EXPECT_TRUE(results[i].values == results[i + 3].values) << results[i].name << " differs";
  };
  return e;
}

// Token ids with many repeats (most from the first 20), so the gradient adds several
// rows into the same table rows; the last id of the vocabulary appears, and so does -1
// (a row held elsewhere: a zero row, no gradient).
Tensor token_ids(int64_t n, int64_t vocab, uint64_t seed) {
  const int frequent = static_cast<int>(std::min<int64_t>(vocab, 20)) - 1;
  std::vector<int32_t> ids = random_integers<int32_t>(n, seed, 0, frequent);
  const std::vector<int32_t> any =
      random_integers<int32_t>(n, seed + 1, 0, static_cast<int>(vocab - 1));
  for (int64_t t = 0; t < n; t += 7) ids[t] = any[t];
  for (int64_t t = 3; t < n; t += 11) ids[t] = -1;
  if (n > 0) ids[n - 1] = static_cast<int32_t>(vocab - 1);
  return host_tensor({n}, ids);
}

// dims (tokens, vocab, hidden); dtypes (table, out and dout); dtable is f32, accumulated
// onto. The GPU adds each id's rows in the CPU's pieces of 32 sorted positions (at 5000
// tokens the frequent ids run over a dozen pieces), the additions the CPU makes, so
// even random fractions agree bit for bit; integers check it apart from that order.
OpEntry embedding() {
  OpEntry e;
  e.name = "embedding";
  e.dims = {{0, 101, 300}, {1, 101, 300}, {257, 101, 300}, {5000, 101, 300}};
  e.dtypes = kOneDtype;
  e.integers = {false, true};
  e.inputs = [](const OpCase& c) {
    const int64_t n = c.dims[0], vocab = c.dims[1], hidden = c.dims[2];
    return std::vector<Tensor>{
        token_ids(n, vocab, 19), input({vocab, hidden}, c.dtypes[0], 20, c, -9, 9),
        input({n, hidden}, c.dtypes[0], 21, c, -9, 9), input({vocab, hidden}, kF32, 22, c, -9, 9)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    Tensor out = r.written({c.dims[0], c.dims[2]}, c.dtypes[0]), dtable = r.updated(3);
    embedding_forward(r.device(), r.in(0), r.in(1), out);
    embedding_backward(r.device(), r.in(0), r.in(2), dtable);
    return std::vector<OpResult>{result("out", out, Match::kExact),
                                 result("dtable", dtable, Match::kExactSum)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t n = c.dims[0], hidden = c.dims[2];
    const std::vector<int32_t> ids = as_ids(in[0]);
    std::vector<double> out(n * hidden), dtable = copy(in[3]);
    cpu::embedding_forward<double>(ids.data(), in[1].data(), n, hidden, out.data());
    cpu::embedding_backward<double>(ids.data(), in[2].data(), n, hidden, dtable.data());
    return Values{out, dtable};
  };
  e.gradient_dims = {{40, 9, 4}};
  e.loss_result = 0;
  e.upstream = 2;
  e.gradients = {{1, 1, 3}};
  return e;
}

// dims (values, counts): f32 values (ties, subnormals, overflow to infinity, NaN among
// them) narrowed to bf16 and widened back; i32 counts widened to f32 (exact up to 2^24),
// more than one GPU launch's grid of them.
constexpr size_t kNegativeZero = 7;  // the place of 0x80000000 among the special values

OpEntry convert_entry() {
  OpEntry e;
  e.name = "convert";
  e.dims = {{100003, 300001}, {0, 0}, {1, 1}};
  e.dtypes = {{kF32}};
  e.inputs = [](const OpCase& c) {
    std::vector<float> values = random_vector<float>(c.dims[0], 23, -1e4, 1e4);
    const uint32_t specials[] = {0x3F808000, 0x3F818000, 0x3F808001, 0x00018000, 0x7F7FFFFF,
                                 0x7F800000, 0xFF800000, 0x80000000, 0x7FC00000, 0x7F800001};
    for (size_t i = 0; i < std::size(specials) && i < values.size(); ++i)
      std::memcpy(&values[i], &specials[i], sizeof(float));
    std::vector<int32_t> counts(c.dims[1]);
    for (size_t i = 0; i < counts.size(); ++i)
      counts[i] = static_cast<int32_t>(i * 53 % 16777217) - 7;
    return std::vector<Tensor>{host_tensor({c.dims[0]}, values), host_tensor({c.dims[1]}, counts)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    Tensor narrow = r.written({c.dims[0]}, kBF16), wide = r.written({c.dims[0]}),
           counts = r.written({c.dims[1]});
    convert(r.device(), r.in(0), narrow);
    convert(r.device(), narrow, wide);
    convert(r.device(), r.in(1), counts);
    return std::vector<OpResult>{result("bf16", narrow, Match::kExact),
                                 result("widened", wide, Match::kExact),
                                 result("counts", counts, Match::kExact)};
  };
  e.reference = [](const Values& in, const OpCase&) {
    std::vector<double> narrow;
    for (double x : in[0]) narrow.push_back(bf16_rounded(x));
    return Values{narrow, narrow, in[1]};
  };
  e.tol = Tolerance{0, 0, 0, 0};
  // A zero keeps its sign both ways (the comparisons let -0 match +0).
  e.invariant = [](const std::vector<OpResult>& results) {
    if (results[0].values.size() <= kNegativeZero) return;
    EXPECT_TRUE(std::signbit(results[0].values[kNegativeZero]));
    EXPECT_TRUE(std::signbit(results[1].values[kNegativeZero]));
  };
  return e;
}

// AdamW: three single-tensor steps per tensor (the bias corrections change, so errors
// would compound), then one multi-tensor step of all of them in one launch with bf16
// working copies, every tensor but the third decayed. dims: the tensors' sizes (spanning
// several of the GPU's 64K chunks, and empty). Inputs per tensor: param, three
// gradients, exp_avg, exp_avg_sq.
constexpr int kAdamInputs = 6;
constexpr float kGradScale = 0.5f;
const AdamWHyper kAdam{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};

void reference_adamw(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
                     std::vector<double>& v, int64_t step, bool decay) {
  cpu::adamw_step<double>(p.data(), g.data(), m.data(), v.data(), static_cast<int64_t>(p.size()),
                          kAdam.lr, kAdam.beta1, kAdam.beta2, kAdam.eps,
                          decay ? kAdam.weight_decay : 0.0f, step, kGradScale);
}

AdamWHyper adam_at(int64_t step) {
  AdamWHyper h = kAdam;
  h.step = step;
  return h;
}

OpEntry adamw() {
  OpEntry e;
  e.name = "adamw";
  e.dims = {{0}, {1}, {100003}, {200001, 0, 7, 65536}};
  e.dtypes = {{kF32}};
  e.inputs = [](const OpCase& c) {
    std::vector<Tensor> in;
    for (size_t t = 0; t < c.dims.size(); ++t) {
      const Shape shape{c.dims[t]};
      const uint64_t seed = 100 + 10 * t;
      in.push_back(input(shape, kF32, seed, c));
      for (int s = 1; s <= 3; ++s) in.push_back(input(shape, kF32, seed + s, c, -2, 2));
      in.push_back(input(shape, kF32, seed + 4, c, -0.1, 0.1));
      in.push_back(input(shape, kF32, seed + 5, c, 0.01, 0.2));
    }
    return in;
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    std::vector<OpResult> results;
    const size_t count = c.dims.size();
    std::vector<Tensor> p, m, v, work;
    std::vector<AdamWUpdate> updates;
    for (size_t t = 0; t < count; ++t) {
      const size_t at = kAdamInputs * t;
      Tensor param = r.updated(at), exp_avg = r.updated(at + 4), exp_avg_sq = r.updated(at + 5);
      for (int s = 1; s <= 3; ++s)
        adamw_step(r.device(), adam_at(s), kGradScale, param, r.in(at + s), exp_avg, exp_avg_sq);
      results.push_back(result("param", param));
      results.push_back(result("exp_avg", exp_avg));
      results.push_back(result("exp_avg_sq", exp_avg_sq));
      p.push_back(r.updated(at));
      m.push_back(r.updated(at + 4));
      v.push_back(r.updated(at + 5));
      work.push_back(r.written({c.dims[t]}, kBF16));
    }
    for (size_t t = 0; t < count; ++t) {
      const size_t at = kAdamInputs * t;
      updates.push_back(AdamWUpdate{&p[t], &r.in(at + 1), &m[t], &v[t], t != 2, &work[t]});
    }
    adamw_step(r.device(), adam_at(4), kGradScale, updates);
    for (size_t t = 0; t < count; ++t) {
      results.push_back(result("multi-tensor param", p[t]));
      results.push_back(result("multi-tensor exp_avg", m[t]));
      results.push_back(result("multi-tensor exp_avg_sq", v[t]));
      results.push_back(result("multi-tensor bf16 copy", work[t]));
    }
    return results;
  };
  e.reference = [](const Values& in, const OpCase& c) {
    Values single, multi;
    for (size_t t = 0; t < c.dims.size(); ++t) {
      const size_t at = kAdamInputs * t;
      std::vector<double> p = copy(in[at]), m = copy(in[at + 4]), v = copy(in[at + 5]);
      for (int s = 1; s <= 3; ++s) reference_adamw(p, in[at + s], m, v, s, true);
      single.insert(single.end(), {p, m, v});
      p = copy(in[at]);
      m = copy(in[at + 4]);
      v = copy(in[at + 5]);
      reference_adamw(p, in[at + 1], m, v, 4, t != 2);
      multi.insert(multi.end(), {p, m, v, p});
    }
    single.insert(single.end(), multi.begin(), multi.end());
    return single;
  };
  return e;
}

// c = op(a) op(b), written over the poison; 2 op(a) op(b) - c, reading c; and the
// product added onto minus itself as the CPU stores it (a result holding the product's
// rounding residue, which a product rounded to bf16 before the sum loses; bounded at
// 1e-3, finer than a bf16 rounding of the product). dims (batch, m, n, k, trans_a,
// trans_b): a of rank 3 when batch > 1 (read as batch m rows), and an empty inner
// dimension (only the beta scaling). dtypes (a and b, c); f32 operands with a bf16
// result are refused. Inputs: a, b, c, minus the stored product.
OpEntry matmul_entry() {
  OpEntry e;
  e.name = "matmul";
  e.dims = {{1, 37, 65, 129, 0, 0}, {1, 37, 65, 129, 0, 1}, {1, 37, 65, 129, 1, 0},
            {1, 37, 65, 129, 1, 1}, {2, 19, 17, 33, 0, 1},  {1, 5, 7, 0, 0, 0}};
  e.dtypes = {{kF32, kF32}, {kBF16, kF32}, {kBF16, kBF16}};
  e.integers = {true, false};
  const auto shapes = [](const OpCase& c) {
    const int64_t batch = c.dims[0], m = c.dims[1], n = c.dims[2], k = c.dims[3];
    const bool trans_a = c.dims[4] != 0, trans_b = c.dims[5] != 0;
    const Shape a = trans_a ? Shape{k, m} : batch > 1 ? Shape{batch, m, k} : Shape{m, k};
    const Shape b = trans_b ? Shape{n, k} : Shape{k, n};
    const Shape out = batch > 1 ? Shape{batch, m, n} : Shape{m, n};
    return std::vector<Shape>{a, b, out};
  };
  e.inputs = [shapes](const OpCase& c) {
    const std::vector<Shape> s = shapes(c);
    const double r = value_range(c);
    const bool trans_a = c.dims[4] != 0, trans_b = c.dims[5] != 0;
    const Tensor a = input(s[0], c.dtypes[0], 24, c, -r, r),
                 b = input(s[1], c.dtypes[0], 25, c, -r, r);
    Tensor minus_product = Tensor::empty(s[2], c.dtypes[1]);
    matmul(cpu_device(), a, trans_a, b, trans_b, minus_product);
    scale_(cpu_device(), minus_product, -1.0f);
    return std::vector<Tensor>{a, b, input(s[2], c.dtypes[1], 26, c, -r, r), minus_product};
  };
  e.run = [shapes](const OpRun& r, const OpCase& c) {
    const bool trans_a = c.dims[4] != 0, trans_b = c.dims[5] != 0;
    Tensor product = r.written(shapes(c)[2], c.dtypes[1]), acc = r.updated(2),
           residue = r.updated(3);
    matmul(r.device(), r.in(0), trans_a, r.in(1), trans_b, product);
    matmul(r.device(), r.in(0), trans_a, r.in(1), trans_b, acc, 2.0f, -1.0f);
    matmul(r.device(), r.in(0), trans_a, r.in(1), trans_b, residue, 1.0f, 1.0f);
    OpResult own_rounding = result("a b - stored a b", residue);
    own_rounding.tol = 1e-3;
    return std::vector<OpResult>{result("a b", product), result("2 a b - c", acc), own_rounding};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t m = c.dims[0] * c.dims[1], n = c.dims[2], k = c.dims[3];
    const bool trans_a = c.dims[4] != 0, trans_b = c.dims[5] != 0;
    std::vector<double> product(m * n), acc = copy(in[2]), residue = copy(in[3]);
    const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
    cpu::gemm<double>(trans_a, trans_b, m, n, k, 1.0, in[0].data(), lda, in[1].data(), ldb, 0.0,
                      product.data(), n);
    cpu::gemm<double>(trans_a, trans_b, m, n, k, 2.0, in[0].data(), lda, in[1].data(), ldb, -1.0,
                      acc.data(), n);
    cpu::gemm<double>(trans_a, trans_b, m, n, k, 1.0, in[0].data(), lda, in[1].data(), ldb, 1.0,
                      residue.data(), n);
    return Values{product, acc, residue};
  };
  return e;
}

// Grouped products over row blocks, a layer's forward and backward: out = a w[g]^T, and
// da = dy w[g], dw[g] += dy^T a, each with the sizes on the host and where the operands
// are. dims (n, k, spare, group sizes...): empty groups first, inside and last, one-row
// groups; one group; row tiles just past, at and short of the GPU's 128; N and K no
// multiple of 16 (element-wise reads) or multiples of 8 only (16-byte reads with tails);
// whole column tiles and several reduction slices; 64 skewed groups; more groups than
// one launch passes host sizes in (1000); all empty. `spare` rows past the groups (the
// MoE layer's buffers sized for every assignment while a capacity drops some): NaN in
// a and dy, which must not be read, and the outputs' rows there must stay unwritten.
// dtypes (a, w and dy; out, da and dw). With integer inputs the empty groups' dw starts
// NaN, which only an op that writes there (even a 0) loses. Inputs: sizes, a, w, dy, dw.
struct GroupedShape {
  int64_t n, k, groups, used, rows;
  std::vector<int32_t> sizes;
};

GroupedShape grouped_shape(const OpCase& c) {
  GroupedShape s{c.dims[0], c.dims[1], static_cast<int64_t>(c.dims.size()) - 3, 0, 0, {}};
  for (size_t g = 3; g < c.dims.size(); ++g) {
    s.sizes.push_back(static_cast<int32_t>(c.dims[g]));
    s.used += c.dims[g];
  }
  s.rows = s.used + c.dims[2];
  return s;
}

// dims of grouped_matmul: n, k, no spare rows, `sizes`.
Shape grouped_dims(int64_t n, int64_t k, const std::vector<int32_t>& sizes) {
  Shape dims{n, k, 0};
  dims.insert(dims.end(), sizes.begin(), sizes.end());
  return dims;
}

// (rows, cols) operand rows: the used ones as `input` makes them, NaN past them.
Tensor grouped_operand(const GroupedShape& s, int64_t cols, DType dtype, uint64_t seed,
                       const OpCase& c) {
  const double r = value_range(c);
  std::vector<double> v = as_doubles(input({s.used, cols}, kF32, seed, c, -r, r));
  v.resize(s.rows * cols, NAN);
  return to_dtype(host_tensor({s.rows, cols}, std::vector<float>(v.begin(), v.end())), dtype);
}

Tensor weight_gradient(const GroupedShape& s, DType dtype, const OpCase& c) {
  const double r = value_range(c);
  std::vector<double> v = as_doubles(input({s.groups, s.n, s.k}, kF32, 30, c, -r, r));
  for (int64_t g = 0; g < s.groups; ++g)
    if (c.integers && s.sizes[g] == 0) std::fill_n(v.begin() + g * s.n * s.k, s.n * s.k, NAN);
  return to_dtype(host_tensor({s.groups, s.n, s.k}, std::vector<float>(v.begin(), v.end())), dtype);
}

OpEntry grouped_matmul() {
  OpEntry e;
  e.name = "grouped_matmul";
  std::vector<int32_t> many(1000);
  for (int g = 0; g < 1000; ++g) many[g] = g % 3;
  e.dims = {grouped_dims(65, 129, {0, 5, 0, 37, 1, 33, 0}),
            grouped_dims(65, 129, {64}),
            grouped_dims(33, 65, {300}),
            grouped_dims(129, 33, {129, 128, 127, 1, 256}),
            grouped_dims(48, 136, skewed_group_sizes()),
            grouped_dims(256, 128, {200, 0, 57}),
            grouped_dims(16, 24, many),
            grouped_dims(65, 129, {5, 0, 17, 1}),
            grouped_dims(24, 40, {0, 7, 0}),
            grouped_dims(65, 129, {0, 0, 0}),
            {48, 136, 150, 0, 70, 3, 129}};
  e.dtypes = {{kF32, kF32}, {kBF16, kBF16}, {kBF16, kF32}};
  e.integers = {true, false};
  e.inputs = [](const OpCase& c) {
    const GroupedShape s = grouped_shape(c);
    const DType d = c.dtypes[0];
    const double r = value_range(c);
    return std::vector<Tensor>{host_tensor({s.groups}, s.sizes), grouped_operand(s, s.k, d, 27, c),
                               input({s.groups, s.n, s.k}, d, 28, c, -r, r),
                               grouped_operand(s, s.n, d, 29, c),
                               weight_gradient(s, c.dtypes[1], c)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const GroupedShape s = grouped_shape(c);
    const DType d = c.dtypes[1];
    std::vector<OpResult> results;
    for (const Tensor& sizes : {r.in(0).on_host(), r.in(0)}) {
      const std::string where = sizes.device().is_cuda() ? " (sizes on the GPU)" : "";
      Tensor out = r.written({s.rows, s.n}, d), da = r.written({s.rows, s.k}, d);
      Tensor dw = r.updated(4);
      grouped_matmul_nt(r.device(), r.in(1), r.in(2), sizes, out);
      grouped_matmul_nn(r.device(), r.in(3), r.in(2), sizes, da);
      grouped_matmul_tn_accumulate(r.device(), r.in(3), r.in(1), sizes, dw);
      results.insert(results.end(), {result("a w^T" + where, out), result("da" + where, da),
                                     result("dw" + where, dw)});
    }
    return results;
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const GroupedShape s = grouped_shape(c);
    std::vector<double> out(s.rows * s.n, NAN), da(s.rows * s.k, NAN), dw = copy(in[4]);
    cpu::grouped_matmul_nt<double>(in[1].data(), in[2].data(), s.sizes.data(), s.groups, s.n, s.k,
                                   out.data());
    cpu::grouped_matmul_nn<double>(in[3].data(), in[2].data(), s.sizes.data(), s.groups, s.n, s.k,
                                   da.data());
    cpu::grouped_matmul_tn_accumulate<double>(in[3].data(), in[1].data(), s.sizes.data(), s.groups,
                                              s.n, s.k, dw.data());
    return Values{out, da, dw, out, da, dw};
  };
  // Empty groups first and in the middle.
  e.gradient_dims = {{3, 4, 0, 2, 0, 3}, grouped_dims(7, 11, {0, 5, 0, 3, 9})};
  e.loss_result = 0;
  e.upstream = 3;
  e.gradients = {{1, 1}, {2, 2, 4}};
  // f32 results from bf16 operands: the tensor cores' f32 additions round otherwise than
  // the CPU's.
  e.tol.f32_from_bf16 = 2e-4;
  return e;
}

// Top-k style routing over kExperts: k distinct experts per token, never experts 3 and 8
// (so some groups are empty), and every 5th token's last assignment not sent (-1).
constexpr int kExperts = 9;

Tensor routing(int64_t n, int k, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(n * k);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> experts = {0, 1, 2, 4, 5, 6, 7};
    for (int j = 0; j < k; ++j) {
      std::swap(experts[j], experts[j + rng.below(experts.size() - j)]);
      ids[t * k + j] = experts[j];
    }
    if (t % 5 == 0) ids[t * k + k - 1] = -1;
  }
  return host_tensor({n, k}, ids);
}

// Router weights from a few values, so capacity decisions meet many ties, plus the
// special values the ranking must order alike: NaN, -inf, +0 and -0.
Tensor router_weights(int64_t n, int k, uint64_t seed) {
  const float choices[] = {0.125f, 0.25f, 0.5f, 0.75f};
  Rng rng(seed);
  std::vector<float> w(n * k);
  for (float& x : w) x = choices[rng.below(4)];
  const float special[] = {std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::infinity(), 0.0f, -0.0f};
  for (size_t i = 0; i < w.size(); i += 11) w[i] = special[(i / 11) % 4];
  return host_tensor({n, k}, w);
}

// Combine weights: binary fractions, so weighted sums of integers are exact.
Tensor combine_weights(int64_t n, int k, uint64_t seed) {
  const float choices[] = {0.25f, 0.5f, -0.75f, 1.0f};
  Rng rng(seed);
  std::vector<float> w(n * k);
  for (float& x : w) x = choices[rng.below(4)];
  return host_tensor({n, k}, w);
}

int64_t sum_of(const std::vector<double>& counts) {
  double rows = 0;
  for (double c : counts) rows += c;
  return static_cast<int64_t>(rows);
}

// The dispatch plan (counts on the device and on the host), the gather, the combine and
// their backwards. dims (tokens, k, capacity): dropless; capacities that drop many, some
// and none of the assignments, and all of them; a single unsent assignment; more
// assignments than the blocks of one grid; empty batches. dtypes (the rows moved). The
// combine reads a buffer with 3 rows past the plan's, which its backward must zero.
// Inputs: ids, router weights, x, dx (accumulated onto), yp, dy, combine weights.
constexpr int64_t kPermuteHidden = 129;

OpEntry permute() {
  OpEntry e;
  e.name = "permute";
  e.dims = {{301, 3, -1}, {301, 3, 17},     {301, 3, 80}, {301, 3, 1000}, {301, 3, 0},
            {1, 1, -1},   {40000, 2, 5000}, {0, 2, -1},   {0, 2, 4}};
  e.dtypes = kOneDtype;
  e.integers = {true, false};
  e.inputs = [](const OpCase& c) {
    const int64_t n = c.dims[0], h = kPermuteHidden;
    const int k = static_cast<int>(c.dims[1]);
    const DType d = c.dtypes[0];
    const double r = 2 * value_range(c);
    return std::vector<Tensor>{routing(n, k, 1),
                               router_weights(n, k, 2),
                               input({n, h}, d, 3, c, -r, r),
                               input({n, h}, d, 4, c, -r, r),
                               input({n * k + 3, h}, d, 5, c, -r, r),
                               input({n, h}, d, 7, c, -r, r),
                               combine_weights(n, k, 6)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t n = c.dims[0], k = c.dims[1], capacity = c.dims[2], h = kPermuteHidden;
    const DType d = c.dtypes[0];
    Tensor counts = r.written({kExperts}, DType::kI32), dest = r.written({n, k}, DType::kI32);
    permute_plan(r.device(), r.in(0), r.in(1), kExperts, capacity, counts, dest);
    Tensor host_counts = poisoned(cpu_device(), {kExperts}, DType::kI32);
    Tensor dest_again = r.written({n, k}, DType::kI32);
    permute_plan(r.device(), r.in(0), r.in(1), kExperts, capacity, host_counts, dest_again);
    const int64_t rows = sum_of(as_doubles(host_counts));
    Tensor xp = r.written({rows, h}, d), dx = r.updated(3), y = r.written({n, h}, d);
    permute_gather(r.device(), r.in(2), dest, xp);
    permute_gather_backward(r.device(), xp, dest, dx);
    unpermute_combine(r.device(), r.in(4), dest, r.in(6), y);
    Tensor dyp = r.written(r.in(4).shape(), d), dweights = r.written({n, k});
    unpermute_combine_backward(r.device(), r.in(5), r.in(4), dest, r.in(6), dyp, dweights);
    return std::vector<OpResult>{
        result("tokens_per_expert", counts, Match::kExact),
        result("dest_rows", dest, Match::kExact),
        result("tokens_per_expert on the host", host_counts, Match::kExact),
        result("dest_rows again", dest_again, Match::kExact),
        result("xp", xp, Match::kExact),
        result("dx", dx),
        result("y", y),
        result("dyp", dyp),
        result("dweights", dweights, Match::kSum)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t n = c.dims[0], capacity = c.dims[2], h = kPermuteHidden;
    const int k = static_cast<int>(c.dims[1]);
    const std::vector<int32_t> ids = as_ids(in[0]);
    std::vector<int32_t> counts(kExperts), dest(n * k);
    cpu::permute_plan<double>(ids.data(), in[1].data(), n, k, kExperts, capacity, counts.data(),
                              dest.data());
    const std::vector<double> count_values(counts.begin(), counts.end());
    const std::vector<double> dest_values(dest.begin(), dest.end());
    const int64_t rows = sum_of(count_values), buffer = n * k + 3;
    std::vector<double> xp(rows * h), dx = copy(in[3]), y(n * h), dyp(buffer * h), dweights(n * k);
    cpu::permute_gather<double>(in[2].data(), dest.data(), xp.data(), n, k, h);
    cpu::permute_gather_backward<double>(xp.data(), dest.data(), dx.data(), n, k, h);
    cpu::unpermute_combine<double>(in[4].data(), dest.data(), in[6].data(), y.data(), n, k, h);
    cpu::unpermute_combine_backward<double>(in[5].data(), in[4].data(), dest.data(), in[6].data(),
                                            dyp.data(), dweights.data(), n, k, h, buffer);
    return Values{count_values, dest_values, count_values, dest_values, xp, dx, y, dyp, dweights};
  };
  // The combine's backward, dropless and with a capacity that drops assignments (the
  // gather's: tests/kernels/permute_test.cc).
  e.gradient_dims = {{7, 2, -1}, {7, 2, 4}};
  e.loss_result = 6;
  e.upstream = 5;
  e.gradients = {{4, 7}, {6, 8}};
  e.choice_inputs = {1};  // the router weights order the assignments a capacity keeps
  e.invariant = [](const std::vector<OpResult>& results) {
    EXPECT_EQ(results[0].values[3], 0) << "expert 3 is never chosen";
    EXPECT_EQ(results[0].values[8], 0) << "expert 8 is never chosen";
  };
  return e;
}

// Expert parallelism's regrouping of received rows. dims (sources, experts): empty
// blocks, a source sending nothing, the most counts the kernel takes; and no rows at all
// ({2, 2}, every count zero).
OpEntry regroup() {
  OpEntry e;
  e.name = "regroup_received_rows";
  e.dims = {{3, 2}, {8, 16}, {64, 64}, {2, 2}};
  e.dtypes = {{DType::kI32}};
  e.integers = {true};
  e.inputs = [](const OpCase& c) {
    const int64_t sources = c.dims[0], experts = c.dims[1];
    std::vector<int32_t> counts(sources * experts, 0);
    if (sources != 2) {
      for (size_t b = 0; b < counts.size(); ++b)
        counts[b] = b % 7 == 3 ? 0 : static_cast<int32_t>(b * 29 % 50);
      std::fill(counts.begin() + experts, counts.begin() + 2 * experts, 0);  // source 1: none
    }
    return std::vector<Tensor>{host_tensor({sources, experts}, counts)};
  };
  e.run = [](const OpRun& r, const OpCase&) {
    Tensor regroup = r.written({sum_of(as_doubles(r.in(0))), 1}, DType::kI32);
    regroup_received_rows(r.device(), r.in(0), regroup);
    return std::vector<OpResult>{result("regroup", regroup, Match::kExact)};
  };
  // Row q of block (source i, expert e) goes after every row of the experts before e and
  // of the sources before i for e.
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t sources = c.dims[0], experts = c.dims[1];
    const std::vector<double>& counts = in[0];
    std::vector<double> places;
    for (int64_t i = 0; i < sources; ++i) {
      for (int64_t e = 0; e < experts; ++e) {
        double before = 0;
        for (int64_t b = 0; b < sources * experts; ++b) {
          const int64_t bi = b / experts, be = b % experts;
          if (be < e || (be == e && bi < i)) before += counts[b];
        }
        for (int q = 0; q < counts[i * experts + e]; ++q) places.push_back(before + q);
      }
    }
    return Values{places};
  };
  return e;
}

// dims (rows, source columns, destination columns): the block of the narrower width less
// one, from source column 1 to the destination's last columns, copied over and added
// onto the destination (the other columns must stay as they were). The largest runs past
// one grid of GPU blocks.
struct ColumnBlock {
  int64_t rows, src_cols, dst_cols, width, src_col, dst_col;
};
ColumnBlock column_block(const OpCase& c) {
  const int64_t width = std::max<int64_t>(0, std::min(c.dims[1], c.dims[2]) - 1);
  return {c.dims[0], c.dims[1], c.dims[2], width, 1, c.dims[2] - width};
}

OpEntry columns() {
  OpEntry e;
  e.name = "columns";
  e.dims = {{0, 5, 7}, {1, 2, 9}, {37, 192, 128}, {3, 64, 576}, {70001, 130, 67}};
  e.dtypes = kOneDtype;
  e.integers = {false, true};
  e.inputs = [](const OpCase& c) {
    return std::vector<Tensor>{input({c.dims[0], c.dims[1]}, c.dtypes[0], 41, c),
                               input({c.dims[0], c.dims[2]}, c.dtypes[0], 42, c)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const ColumnBlock b = column_block(c);
    Tensor copied = r.updated(1), added = r.updated(1);
    copy_columns(r.device(), r.in(0), b.src_col, copied, b.dst_col, b.width);
    add_columns(r.device(), r.in(0), b.src_col, added, b.dst_col, b.width);
    return std::vector<OpResult>{result("copied", copied, Match::kExact), result("added", added)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const ColumnBlock b = column_block(c);
    std::vector<double> copied = copy(in[1]), added = copy(in[1]);
    cpu::copy_columns<double>(in[0].data() + b.src_col, b.src_cols, copied.data() + b.dst_col,
                              b.dst_cols, b.rows, b.width);
    cpu::add_columns<double>(in[0].data() + b.src_col, b.src_cols, added.data() + b.dst_col,
                             b.dst_cols, b.rows, b.width);
    return Values{copied, added};
  };
  return e;
}

}  // namespace

const std::vector<OpEntry>& op_table() {
  static const std::vector<OpEntry> table = [] {
    std::vector<OpEntry> entries = {
        add_and_scale(),
        bias(),
        sigmoid_gate(),
        sum_squares_entry(),
        row_sum_squares_entry(),
        rmsnorm(),
        swiglu(),
        rope(),
        embedding(),
        convert_entry(),
        adamw(),
        matmul_entry(),
        grouped_matmul(),
        permute(),
        regroup(),
        attention(),
        columns(),
    };
    for (OpEntry& e : routing_entries()) entries.push_back(std::move(e));
    return entries;
  }();
  return table;
}

}  // namespace switchyard::testing
