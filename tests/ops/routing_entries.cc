// The router's entries of the op table (tests/ops/op_table.h): the softmax, sigmoid and
// expert-choice gatings with their fused router forwards, GShard's dispatch, round-robin
// routing, the z-loss, the routing statistics of the aux losses, and cross-entropy. Their
// operands are f32 whatever the activations' dtype.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/runtime/rng.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/gating.h"
#include "kernels/cpu/router_aux.h"
#include "kernels/cpu/sequence_aux.h"
#include "kernels/cross_entropy.h"
#include "kernels/gating.h"
#include "kernels/router_aux.h"
#include "kernels/sequence_aux.h"
#include "tests/ops/op_entries.h"
#include "tests/tensor_test_util.h"

namespace switchyard::testing {
namespace {

const std::vector<std::vector<DType>> kF32Only = {{kF32}};

// The steps first, first + 1, ... of a ladder of `experts` rungs in a random order.
std::vector<int> shuffled_ladder(Rng& rng, int64_t experts, int first) {
  std::vector<int> ladder(experts);
  std::iota(ladder.begin(), ladder.end(), first);
  for (int64_t e = experts - 1; e > 0; --e) std::swap(ladder[e], ladder[rng.below(e + 1)]);
  return ladder;
}

// Router logits whose probabilities are far apart within a row (a shuffled ladder with
// steps of 0.37 plus small noise), so rounding cannot reorder the top k; with `ties`,
// exact ties too: row 0 all equal (the lowest ids win), row 1 two equal maxima.
Tensor router_logits(int64_t n, int64_t experts, uint64_t seed, bool ties) {
  Rng rng(seed);
  std::vector<float> logits(n * experts);
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<int> ladder = shuffled_ladder(rng, experts, 0);
    for (int64_t e = 0; e < experts; ++e)
      logits[r * experts + e] = static_cast<float>(0.37 * ladder[e] - 2.0 + 0.01 * rng.uniform());
  }
  if (ties && n > 0) std::fill(logits.begin(), logits.begin() + experts, 0.5f);
  if (ties && n > 1 && experts > 2) {
    float* row = logits.data() + experts;
    for (int64_t e = 0; e < experts; ++e) row[e] = -1.0f - 0.1f * static_cast<float>(e);
    row[experts - 1] = row[1] = 3.0f;
  }
  return host_tensor({n, experts}, logits);
}

// `ids` (n, k) with slots of expert id -1 (no expert): row r's slot r mod (k + 1), so
// some rows keep every slot and others lose one, row 0 its first; and every slot of row 1.
std::vector<int32_t> with_no_expert_slots(std::vector<int32_t> ids, int64_t n, int64_t k) {
  for (int64_t r = 0; r < n; ++r)
    if (r % (k + 1) < k) ids[r * k + r % (k + 1)] = -1;
  if (n > 1) std::fill_n(ids.begin() + k, k, -1);
  return ids;
}

// The same ids with holes, where `ids` is.
Tensor with_no_expert_slots(const Tensor& ids) {
  const Tensor holed = host_tensor(
      ids.shape(), with_no_expert_slots(values_of<int32_t>(ids), ids.dim(0), ids.dim(1)));
  return ids.device().is_cuda() ? holed.to(ids.device()) : holed;
}

// A router forward's sums (2E + 1) as two results: the selections per expert (exact on
// both backends), then the probability sums and the z-loss sum.
void add_sums(std::vector<OpResult>& results, const Tensor& sums, int64_t experts) {
  const Tensor flat = sums.reshape({2 * experts + 1, 1});
  results.push_back(result("selections", flat.slice_rows(0, experts), Match::kExact));
  results.push_back(
      result("probability and z-loss sums", flat.slice_rows(experts, 2 * experts + 1)));
}

// The template's sums of a router forward: selections, then probability sums and z-loss.
void add_reference_sums(Values& out, const std::vector<double>& logits,
                        const std::vector<double>& probs, const std::vector<int32_t>& ids,
                        int64_t n, int64_t experts, int64_t k) {
  std::vector<double> selections(experts), sums(experts + 1);
  cpu::routing_counts<double>(probs.data(), ids.data(), n, experts, k, selections.data(),
                              sums.data());
  sums[experts] = cpu::router_z_loss_sum<double>(logits.data(), n, experts);
  out.push_back(selections);
  out.push_back(sums);
}

// The template's ids as doubles.
std::vector<double> id_values(const std::vector<int32_t>& ids) {
  return std::vector<double>(ids.begin(), ids.end());
}

// Softmax top-k gating and its backward, the latter also with slots of no expert.
// dims (n, experts, k, renormalize, ties): ties in the logits (router_logits) everywhere
// but in the finite differences, which a tie would move to another expert. Inputs:
// logits, dweights.
OpEntry softmax_gating() {
  OpEntry e;
  e.name = "softmax_gating";
  for (int64_t renormalize : {0, 1})
    for (const Shape& s : std::vector<Shape>{
             {257, 13, 3}, {1000, 64, 8}, {5, 1, 1}, {0, 8, 2}, {257, 16, 1}, {257, 16, 3}})
      e.dims.push_back({s[0], s[1], s[2], renormalize, 1});
  e.dtypes = kF32Only;
  e.inputs = [](const OpCase& c) {
    return std::vector<Tensor>{router_logits(c.dims[0], c.dims[1], 1, c.dims[4] != 0),
                               random_tensor({c.dims[0], c.dims[2]}, 2)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t n = c.dims[0], experts = c.dims[1];
    const int k = static_cast<int>(c.dims[2]);
    const bool renormalize = c.dims[3] != 0;
    Tensor probs = r.written({n, experts}), ids = r.written({n, k}, DType::kI32),
           weights = r.written({n, k});
    gating_forward(r.device(), r.in(0), k, renormalize, probs, ids, weights);
    Tensor dlogits = r.written({n, experts}), dholed = r.written({n, experts});
    gating_backward(r.device(), probs, ids, r.in(1), renormalize, dlogits);
    gating_backward(r.device(), probs, with_no_expert_slots(ids), r.in(1), renormalize, dholed);
    return std::vector<OpResult>{result("probs", probs), result("expert_ids", ids, Match::kExact),
                                 result("weights", weights), result("dlogits", dlogits),
                                 result("dlogits, slots of no expert", dholed)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t n = c.dims[0], experts = c.dims[1];
    const int k = static_cast<int>(c.dims[2]);
    const bool renormalize = c.dims[3] != 0;
    std::vector<double> probs(n * experts), weights(n * k), dlogits(n * experts),
        dholed(n * experts);
    std::vector<int32_t> ids(n * k);
    cpu::gating_forward<double>(in[0].data(), probs.data(), ids.data(), weights.data(), n, experts,
                                k, renormalize);
    cpu::gating_backward<double>(probs.data(), ids.data(), in[1].data(), dlogits.data(), n, experts,
                                 k, renormalize);
    const std::vector<int32_t> holed = with_no_expert_slots(ids, n, k);
    cpu::gating_backward<double>(probs.data(), holed.data(), in[1].data(), dholed.data(), n,
                                 experts, k, renormalize);
    return Values{probs, id_values(ids), weights, dlogits, dholed};
  };
  e.gradient_dims = {{4, 6, 3, 0, 0}, {4, 6, 3, 1, 0}};
  e.loss_result = 2;
  e.upstream = 1;
  e.gradients = {{0, 3}};
  return e;
}

// The fused router forward: gating_forward's outputs and the routing sums. Rows around
// the GPU's 32-token chunks and past its 512 blocks, experts past what it fuses.
// dims (n, experts, k, renormalize).
OpEntry router_forward_entry() {
  OpEntry e;
  e.name = "router_forward";
  for (int64_t renormalize : {0, 1})
    for (const Shape& s : std::vector<Shape>{{1, 1, 1},
                                             {31, 8, 2},
                                             {33, 8, 2},
                                             {1000, 64, 8},
                                             {70001, 6, 2},
                                             {300, 300, 4},
                                             {0, 8, 2}})
      e.dims.push_back({s[0], s[1], s[2], renormalize});
  e.dtypes = kF32Only;
  e.inputs = [](const OpCase& c) {
    return std::vector<Tensor>{router_logits(c.dims[0], c.dims[1], 6, true)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t n = c.dims[0], experts = c.dims[1];
    const int k = static_cast<int>(c.dims[2]);
    Tensor probs = r.written({n, experts}), ids = r.written({n, k}, DType::kI32),
           weights = r.written({n, k}), sums = r.written({2 * experts + 1});
    router_forward(r.device(), r.in(0), k, c.dims[3] != 0, probs, ids, weights, sums);
    std::vector<OpResult> results{result("probs", probs), result("expert_ids", ids, Match::kExact),
                                  result("weights", weights)};
    add_sums(results, sums, experts);
    return results;
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t n = c.dims[0], experts = c.dims[1];
    const int k = static_cast<int>(c.dims[2]);
    std::vector<double> probs(n * experts), weights(n * k);
    std::vector<int32_t> ids(n * k);
    cpu::gating_forward<double>(in[0].data(), probs.data(), ids.data(), weights.data(), n, experts,
                                k, c.dims[3] != 0);
    Values out{probs, id_values(ids), weights};
    add_reference_sums(out, in[0], probs, ids, n, experts, k);
    return out;
  };
  return e;
}

// The sigmoid router (group-limited, biased choice: DeepSeek-V3's settings, and one
// group without renormalisation), its backward (also with slots of no expert), and the
// round-robin routing of forced balance on the same (n, k). dims (n, experts, setting,
// ties as for softmax_gating).
// Inputs: logits, the selection bias, dweights.
// Sigmoid router logits whose scores are a shuffled ladder (k + 1) / (E + 1), k < E, and
// a bias of multiples of 2^-12 up to 0.03, which moves experts past their neighbours. A
// score plus bias is then at least 1 / (4096 (E + 1)) from any other unless equal, far
// above f32 rounding, so both backends and the template choose alike; with `ties`, row
// 0's scores are all equal and the bias alone chooses.
Tensor sigmoid_logits(int64_t n, int64_t experts, uint64_t seed, bool ties) {
  Rng rng(seed);
  std::vector<float> logits(n * experts);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int> ladder = shuffled_ladder(rng, experts, 1);
    if (ties && r == 0) std::fill(ladder.begin(), ladder.end(), 1);
    for (int64_t e = 0; e < experts; ++e) {
      const double score = static_cast<double>(ladder[e]) / static_cast<double>(experts + 1);
      logits[r * experts + e] = static_cast<float>(std::log(score / (1 - score)));
    }
  }
  return host_tensor({n, experts}, logits);
}

Tensor sigmoid_bias(int64_t experts, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> bias(experts);
  for (float& b : bias) b = std::ldexp(static_cast<float>(rng.below(241)) - 120.0f, -12);
  return host_tensor({experts}, bias);
}

// Setting 3 needs 16 experts or more (6 experts from 1 of 2 groups).
const SigmoidGating kSigmoidSettings[] = {
    {.k = 4, .renormalize = true, .scaling = 2.5f, .num_groups = 4, .top_groups = 2},
    {.k = 2, .renormalize = false, .scaling = 1.0f, .num_groups = 1, .top_groups = 1},
    {.k = 3, .renormalize = true, .scaling = 1.0f, .num_groups = 8, .top_groups = 3},
    {.k = 6, .renormalize = false, .scaling = 0.5f, .num_groups = 2, .top_groups = 1}};
constexpr int64_t kFirstToken = 17;

OpEntry sigmoid_router() {
  OpEntry e;
  e.name = "sigmoid_router";
  for (int64_t setting : {0, 1})
    for (const Shape& s : std::vector<Shape>{{257, 16}, {1000, 64}, {0, 8}})
      e.dims.push_back({s[0], s[1], setting, 1});
  for (int64_t setting : {2, 3}) e.dims.push_back({257, 16, setting, 1});
  e.dtypes = kF32Only;
  e.inputs = [](const OpCase& c) {
    const SigmoidGating& g = kSigmoidSettings[c.dims[2]];
    return std::vector<Tensor>{sigmoid_logits(c.dims[0], c.dims[1], 8, c.dims[3] != 0),
                               sigmoid_bias(c.dims[1], 9), random_tensor({c.dims[0], g.k}, 10)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t n = c.dims[0], experts = c.dims[1];
    const SigmoidGating& g = kSigmoidSettings[c.dims[2]];
    Tensor scores = r.written({n, experts}), ids = r.written({n, g.k}, DType::kI32),
           weights = r.written({n, g.k}), sums = r.written({2 * experts + 1});
    sigmoid_router_forward(r.device(), r.in(0), r.in(1), g, scores, ids, weights, sums);
    Tensor dlogits = r.written({n, experts}), dholed = r.written({n, experts});
    sigmoid_gating_backward(r.device(), scores, ids, r.in(2), g, dlogits);
    sigmoid_gating_backward(r.device(), scores, with_no_expert_slots(ids), r.in(2), g, dholed);
    Tensor even_ids = r.written({n, g.k}, DType::kI32), even_weights = r.written({n, g.k});
    round_robin_routing(r.device(), kFirstToken, static_cast<int>(experts), even_ids, even_weights);
    std::vector<OpResult> results{result("scores", scores),
                                  result("expert_ids", ids, Match::kExact),
                                  result("weights", weights)};
    add_sums(results, sums, experts);
    results.push_back(result("dlogits", dlogits));
    results.push_back(result("dlogits, slots of no expert", dholed));
    results.push_back(result("round-robin ids", even_ids, Match::kExact));
    results.push_back(result("round-robin weights", even_weights, Match::kExact));
    return results;
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t n = c.dims[0], experts = c.dims[1];
    const SigmoidGating& g = kSigmoidSettings[c.dims[2]];
    const std::vector<float> bias(in[1].begin(), in[1].end());
    std::vector<double> scores(n * experts), weights(n * g.k), dlogits(n * experts),
        dholed(n * experts), even_weights(n * g.k);
    std::vector<int32_t> ids(n * g.k), even_ids(n * g.k);
    cpu::sigmoid_gating_forward<double>(in[0].data(), bias.data(), scores.data(), ids.data(),
                                        weights.data(), n, experts, g);
    Values out{scores, id_values(ids), weights};
    add_reference_sums(out, in[0], scores, ids, n, experts, g.k);
    cpu::sigmoid_gating_backward<double>(scores.data(), ids.data(), in[2].data(), dlogits.data(), n,
                                         experts, g);
    const std::vector<int32_t> holed = with_no_expert_slots(ids, n, g.k);
    cpu::sigmoid_gating_backward<double>(scores.data(), holed.data(), in[2].data(), dholed.data(),
                                         n, experts, g);
    cpu::round_robin_routing<double>(kFirstToken, even_ids.data(), even_weights.data(), n, experts,
                                     g.k);
    out.insert(out.end(), {dlogits, dholed, id_values(even_ids), even_weights});
    return out;
  };
  e.gradient_dims = {{4, 8, 0, 0}, {4, 8, 1, 0}, {4, 8, 2, 0}, {4, 16, 3, 0}};
  e.loss_result = 2;
  e.upstream = 2;
  e.gradients = {{0, 5}};
  return e;
}

// Expert choice: the router forward's probabilities and sums (every expert takes its
// capacity); the choice and its backward from the same probabilities on both backends
// (input 1: the CPU's softmax of the logits), so that both rank the same values and take
// the same tokens. dims (n, experts, capacity). Inputs: logits, probs, dweights.
Tensor softmax_of(const Tensor& logits) {
  const int64_t n = logits.dim(0);
  Tensor probs = Tensor::empty(logits.shape()), ids = Tensor::empty({n, 1}, DType::kI32),
         weights = Tensor::empty({n, 1});
  gating_forward(cpu_device(), logits, 1, false, probs, ids, weights);
  return probs;
}

OpEntry expert_choice() {
  OpEntry e;
  e.name = "expert_choice";
  e.dims = {{257, 16, 40}, {1000, 8, 250}, {3, 4, 5}, {0, 8, 1}};
  e.dtypes = kF32Only;
  e.inputs = [](const OpCase& c) {
    const Tensor logits = router_logits(c.dims[0], c.dims[1], 11, true);
    return std::vector<Tensor>{logits, softmax_of(logits),
                               random_tensor({c.dims[0], c.dims[1]}, 12)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t n = c.dims[0], experts = c.dims[1], capacity = c.dims[2];
    Tensor probs = r.written({n, experts}), router_ids = r.written({n, experts}, DType::kI32),
           router_weights = r.written({n, experts}), sums = r.written({2 * experts + 1});
    expert_choice_router_forward(r.device(), r.in(0), capacity, probs, router_ids, router_weights,
                                 sums);
    Tensor ids = r.written({n, experts}, DType::kI32), weights = r.written({n, experts});
    expert_choice_forward(r.device(), r.in(1), capacity, ids, weights);
    Tensor dlogits = r.written({n, experts});
    expert_choice_backward(r.device(), r.in(1), ids, r.in(2), dlogits);
    std::vector<OpResult> results{result("probs", probs)};
    add_sums(results, sums, experts);
    results.push_back(result("expert_ids", ids, Match::kExact));
    results.push_back(result("weights", weights, Match::kExact));
    results.push_back(result("dlogits", dlogits));
    return results;
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t n = c.dims[0], experts = c.dims[1], capacity = c.dims[2];
    std::vector<double> probs(n * experts), weights(n * experts), dlogits(n * experts);
    for (int64_t t = 0; t < n; ++t)
      cpu::softmax_row<double>(in[0].data() + t * experts, probs.data() + t * experts, experts);
    std::vector<int32_t> ids(n * experts);
    cpu::expert_choice_forward<double>(probs.data(), ids.data(), weights.data(), n, experts,
                                       capacity);
    Values out{probs};
    add_reference_sums(out, in[0], probs, ids, n, experts, experts);
    cpu::expert_choice_forward<double>(in[1].data(), ids.data(), weights.data(), n, experts,
                                       capacity);
    cpu::expert_choice_backward<double>(in[1].data(), ids.data(), in[2].data(), dlogits.data(), n,
                                        experts);
    out.insert(out.end(), {id_values(ids), weights, dlogits});
    return out;
  };
  return e;
}

// GShard's dispatch of the second expert: the device draws the CPU's numbers, so the
// same assignments are sent. dims (n). Inputs: top-2 ids and weights of 8 experts.
constexpr uint64_t kGshardSeed = 5, kGshardFirstDraw = uint64_t{1} << 20;

OpEntry gshard_dispatch() {
  OpEntry e;
  e.name = "gshard_dispatch";
  e.dims = {{1}, {1000}, {70001}};
  e.dtypes = kF32Only;
  e.inputs = [](const OpCase& c) {
    const int64_t n = c.dims[0];
    Tensor probs = Tensor::empty({n, 8}), ids = Tensor::empty({n, 2}, DType::kI32),
           weights = Tensor::empty({n, 2});
    gating_forward(cpu_device(), router_logits(n, 8, 7, true), 2, true, probs, ids, weights);
    return std::vector<Tensor>{ids, weights};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    Tensor dispatch = r.written({c.dims[0], 2}, DType::kI32);
    gshard_dispatch_ids(r.device(), r.in(0), r.in(1), kGshardSeed, kGshardFirstDraw, dispatch);
    return std::vector<OpResult>{result("dispatch_ids", dispatch, Match::kExact)};
  };
  // Token t's second expert is sent when draw t of the stream is below twice its weight.
  e.reference = [](const Values& in, const OpCase& c) {
    std::vector<double> dispatch = in[0];
    for (int64_t t = 0; t < c.dims[0]; ++t) {
      const double u = Rng::uniform_at(kGshardSeed, kGshardFirstDraw + static_cast<uint64_t>(t));
      if (u >= 2 * in[1][2 * t + 1]) dispatch[2 * t + 1] = -1;
    }
    return Values{dispatch};
  };
  return e;
}

// The router z-loss: the sum over rows of logsumexp^2, and its gradient (times
// kZScale / n) accumulated onto dlogits. dims (n, experts). Inputs: logits, dlogits,
// and the weight kZScale / n the backward gives each row's term (the upstream of the
// finite differences).
constexpr float kZScale = 0.25f;

OpEntry router_z_loss() {
  OpEntry e;
  e.name = "router_z_loss";
  e.dims = {{257, 13}, {20000, 64}, {1, 1}, {0, 8}};
  e.dtypes = kF32Only;
  e.inputs = [](const OpCase& c) {
    const int64_t n = c.dims[0];
    const float weight = kZScale / static_cast<float>(std::max<int64_t>(n, 1));
    return std::vector<Tensor>{random_tensor({n, c.dims[1]}, 4, -6, 6),
                               random_tensor({n, c.dims[1]}, 5),
                               host_tensor({1}, std::vector<float>{weight})};
  };
  e.run = [](const OpRun& r, const OpCase&) {
    Tensor z_sum = r.written({1}), dlogits = r.updated(1);
    router_z_loss_sum(r.device(), r.in(0), z_sum);
    router_z_loss_backward(r.device(), r.in(0), kZScale, dlogits);
    return std::vector<OpResult>{result("z-loss sum", z_sum), result("dlogits", dlogits)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t n = c.dims[0], experts = c.dims[1];
    std::vector<double> dlogits = copy(in[1]);
    cpu::router_z_loss_backward<double>(in[0].data(), kZScale, dlogits.data(), n, experts);
    return Values{{cpu::router_z_loss_sum<double>(in[0].data(), n, experts)}, dlogits};
  };
  e.gradient_dims = {{3, 5}};
  e.loss_result = 0;
  e.upstream = 2;
  e.gradients = {{0, 1, 1}};
  return e;
}

// The aux loss's routing statistics (selections counted exactly, ids of -1 for no
// expert) and its gradient accumulated onto dlogits, from the softmax of the logits (so
// that the gradient is that of the probability sums, for the finite differences).
// dims (n). Inputs: logits, ids, the per-expert probability gradient, dlogits.
constexpr int64_t kAuxExperts = 13, kAuxK = 3;

OpEntry router_aux() {
  OpEntry e;
  e.name = "router_aux";
  e.dims = {{0}, {1}, {1000}, {30000}};
  e.dtypes = kF32Only;
  e.inputs = [](const OpCase& c) {
    const int64_t n = c.dims[0];
    return std::vector<Tensor>{random_tensor({n, kAuxExperts}, 1, -2, 2),
                               expert_ids(n, kAuxK, kAuxExperts, 2),
                               random_tensor({kAuxExperts}, 3), random_tensor({n, kAuxExperts}, 4)};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t n = c.dims[0];
    Tensor probs = r.written({n, kAuxExperts}), top1 = r.written({n, 1}, DType::kI32),
           top1_weights = r.written({n, 1});
    gating_forward(r.device(), r.in(0), 1, false, probs, top1, top1_weights);
    Tensor selections = r.written({kAuxExperts}), prob_sums = r.written({kAuxExperts});
    routing_counts(r.device(), probs, r.in(1), selections, prob_sums);
    Tensor dlogits = r.updated(3);
    aux_loss_backward(r.device(), probs, r.in(2), dlogits);
    OpResult sums = result("prob_sums", prob_sums);
    sums.tol = 1e-6;  // summed in double, rounded once
    return std::vector<OpResult>{result("selections", selections, Match::kExact), sums,
                                 result("dlogits", dlogits)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t n = c.dims[0];
    const std::vector<int32_t> ids = as_ids(in[1]);
    std::vector<double> probs(n * kAuxExperts), selections(kAuxExperts), prob_sums(kAuxExperts),
        dlogits = copy(in[3]);
    for (int64_t t = 0; t < n; ++t)
      cpu::softmax_row<double>(in[0].data() + t * kAuxExperts, probs.data() + t * kAuxExperts,
                               kAuxExperts);
    cpu::routing_counts<double>(probs.data(), ids.data(), n, kAuxExperts, kAuxK, selections.data(),
                                prob_sums.data());
    cpu::aux_loss_backward<double>(probs.data(), in[2].data(), n, kAuxExperts, dlogits.data());
    return Values{selections, prob_sums, dlogits};
  };
  e.gradient_dims = {{4}};
  e.loss_result = 1;
  e.upstream = 2;
  e.gradients = {{0, 2, 3}};
  return e;
}

// The sequence-wise aux loss's sums per sequence and its gradient accumulated onto
// dlogits, for a rank's rows: all of the 6 sequences of 700, none, and a share that
// starts and ends inside sequences; from the logits' softmax probabilities (normalize
// 0) or sigmoid scores (1), so that the gradient is that of the loss the sums give.
// dims (first token, n, normalize). Inputs: logits, ids, dlogits, a zero selection bias
// (for the sigmoid), and the weight of each sum in that loss: kSeqAuxScale times the
// sequence's selections of the expert, on the score sums (the upstream of the finite
// differences, over rows that cross from one sequence into the next).
constexpr int64_t kSeqLen = 700, kSequences = 6;
constexpr float kSeqAuxScale = 0.01f;
const SigmoidGating kOneSigmoid{};

Tensor sequence_loss_weights(const Tensor& ids, int64_t first) {
  const std::vector<int32_t> v = values_of<int32_t>(ids);
  std::vector<float> weights(kSequences * 2 * kAuxExperts, 0.0f);
  for (size_t a = 0; a < v.size(); ++a) {
    const int64_t sequence = (first + static_cast<int64_t>(a) / kAuxK) / kSeqLen;
    if (v[a] >= 0) weights[(sequence * 2 + 1) * kAuxExperts + v[a]] += kSeqAuxScale;
  }
  return host_tensor({kSequences, 2 * kAuxExperts}, weights);
}

OpEntry sequence_aux() {
  OpEntry e;
  e.name = "sequence_aux";
  for (int64_t normalize : {0, 1})
    for (const Shape& s : std::vector<Shape>{{0, kSequences * kSeqLen}, {0, 0}, {1234, 1500}})
      e.dims.push_back({s[0], s[1], normalize});
  e.dtypes = kF32Only;
  e.inputs = [](const OpCase& c) {
    const int64_t n = c.dims[1];
    const Tensor ids = expert_ids(n, kAuxK, kAuxExperts, 2);
    return std::vector<Tensor>{random_tensor({n, kAuxExperts}, 1, -2, 2), ids,
                               random_tensor({n, kAuxExperts}, 4),
                               host_tensor({kAuxExperts}, std::vector<float>(kAuxExperts, 0.0f)),
                               sequence_loss_weights(ids, c.dims[0])};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t n = c.dims[1];
    const SequenceRows rows{c.dims[0], kSeqLen};
    const bool normalize = c.dims[2] != 0;
    Tensor probs = r.written({n, kAuxExperts}), top1 = r.written({n, 1}, DType::kI32),
           top1_weights = r.written({n, 1});
    if (normalize)
      sigmoid_gating_forward(r.device(), r.in(0), r.in(3), kOneSigmoid, probs, top1, top1_weights);
    else
      gating_forward(r.device(), r.in(0), 1, false, probs, top1, top1_weights);
    Tensor sums = r.written({kSequences, 2 * kAuxExperts});
    sequence_routing_sums(r.device(), probs, r.in(1), normalize, rows, sums);
    Tensor dlogits = r.updated(2);
    sequence_aux_backward(r.device(), probs, sums, normalize, rows, kSeqAuxScale, dlogits);
    OpResult sum_result = result("sums", sums);
    sum_result.tol = 1e-6;  // summed in double, rounded once
    return std::vector<OpResult>{sum_result, result("dlogits", dlogits)};
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t first = c.dims[0], n = c.dims[1];
    const bool normalize = c.dims[2] != 0;
    const std::vector<int32_t> ids = as_ids(in[1]);
    std::vector<double> probs(n * kAuxExperts), sums(kSequences * 2 * kAuxExperts),
        dlogits = copy(in[2]);
    for (int64_t t = 0; t < n; ++t) {
      const double* logits = in[0].data() + t * kAuxExperts;
      double* p = probs.data() + t * kAuxExperts;
      if (!normalize) cpu::softmax_row<double>(logits, p, kAuxExperts);
      for (int64_t x = 0; normalize && x < kAuxExperts; ++x) p[x] = 1 / (1 + std::exp(-logits[x]));
    }
    cpu::sequence_routing_sums<double>(probs.data(), ids.data(), n, kAuxExperts, kAuxK, normalize,
                                       first, kSeqLen, kSequences, sums.data());
    cpu::sequence_aux_backward<double>(probs.data(), sums.data(), n, kAuxExperts, normalize, first,
                                       kSeqLen, kSeqAuxScale, dlogits.data());
    return Values{sums, dlogits};
  };
  e.gradient_dims = {{697, 6, 1}};
  e.loss_result = 0;
  e.upstream = 4;
  e.gradients = {{0, 1, 2}};
  return e;
}

// Cross-entropy targets for logits holding columns [first, last] of a vocabulary of
// `whole` ids: most in those columns, every fifth row anywhere in the vocabulary (for a
// shard, mostly outside it), every seventh ignored (-1 or -100); the last row aims at
// the last column; for a shard, rows 1 and 2 just before and just after its columns.
Tensor targets(int64_t n, int64_t first, int64_t last, int64_t whole, uint64_t seed) {
  std::vector<int32_t> t =
      random_integers<int32_t>(n, seed, static_cast<int>(first), static_cast<int>(last));
  const std::vector<int32_t> any =
      random_integers<int32_t>(n, seed + 1, 0, static_cast<int>(whole - 1));
  for (int64_t r = 4; r < n; r += 5) t[r] = any[r];
  for (int64_t r = 3; r < n; r += 7) t[r] = r % 2 ? -1 : -100;
  if (n > 0) t[n - 1] = static_cast<int32_t>(last);
  const bool shard = last - first + 1 < whole;
  if (shard && n > 2) t[1] = static_cast<int32_t>(first - 1);
  if (shard && n > 2 && last + 1 < whole) t[2] = static_cast<int32_t>(last + 1);
  return host_tensor({n}, t);
}

// Cross-entropy over the whole vocabulary (whole 0) or a shard of its columns [start,
// start + width) of `whole`: the forward (losses and lse, or the shard's lse and target
// logits), then the backward from a given lse (the CPU forward's, plus the other shards'
// 1.5 for a shard; both backends take the same, so the backward is compared alone) into
// an f32 gradient, in place over the logits, and into a bf16 gradient. dims (rows, width,
// start, whole, large): vocabularies below and far above a GPU block (256), GPT-2's
// included, more rows than one grid of blocks, none; shards inside, at the end and of
// one column; large: logits near 1000 (exp overflows unshifted) whose first 300
// columns are -inf as masked columns are. Inputs: logits, targets, lse, and each row's
// weight in the loss the backward differentiates (kCrossEntropyScale; the upstream of
// the finite differences, over the whole vocabulary).
constexpr float kCrossEntropyScale = 0.37f;

Tensor cross_entropy_logits(const OpCase& c) {
  const int64_t rows = c.dims[0], width = c.dims[1];
  if (c.dims[4] == 0) return random_tensor({rows, width}, 1, -4.0, 4.0);
  std::vector<float> values = random_vector<float>(rows * width, 5, 996.0, 1004.0);
  for (int64_t r = 0; r < rows; ++r) std::fill_n(values.begin() + r * width, 300, -INFINITY);
  return host_tensor({rows, width}, values);
}

// Targets of the large logits: unmasked columns, and row 3 ignored.
Tensor unmasked_targets(int64_t rows, int64_t width) {
  std::vector<int32_t> ids = random_integers<int32_t>(rows, 6, 300, static_cast<int>(width - 1));
  ids[3] = -1;
  return host_tensor({rows}, ids);
}

Tensor backward_lse(const Tensor& logits, const Tensor& targets, const VocabShard& shard) {
  const int64_t rows = logits.dim(0);
  Tensor lse = Tensor::empty({rows}), other = Tensor::empty({rows});
  if (shard.whole == 0) {
    cross_entropy_forward(cpu_device(), logits, targets, other, lse);
    return lse;
  }
  cross_entropy_shard_forward(cpu_device(), logits, targets, shard, lse, other);
  std::vector<float> whole = values_of<float>(lse);
  for (float& v : whole) v += 1.5f;
  return host_tensor({rows}, whole);
}

OpEntry cross_entropy() {
  OpEntry e;
  e.name = "cross_entropy";
  for (int64_t rows : {1, 7, 300})
    for (int64_t vocab : {1, 33, 1000, 50257}) e.dims.push_back({rows, vocab, 0, 0, 0});
  e.dims.insert(e.dims.end(), {{70001, 5, 0, 0, 0},
                               {0, 33, 0, 0, 0},
                               {7, 33, 17, 100, 0},
                               {300, 1000, 24000, 50257, 0},
                               {300, 257, 50000, 50257, 0},
                               {5, 1, 49, 50, 0},
                               {7, 1000, 0, 0, 1}});
  e.dtypes = kF32Only;
  e.inputs = [](const OpCase& c) {
    const int64_t rows = c.dims[0], width = c.dims[1], start = c.dims[2];
    const VocabShard shard{start, c.dims[3]};
    const int64_t whole = shard.whole == 0 ? width : shard.whole;
    const Tensor logits = cross_entropy_logits(c);
    const Tensor t = c.dims[4] == 0 ? targets(rows, start, start + width - 1, whole, 2)
                                    : unmasked_targets(rows, width);
    return std::vector<Tensor>{logits, t, backward_lse(logits, t, shard),
                               host_tensor({rows}, std::vector<float>(rows, kCrossEntropyScale))};
  };
  e.run = [](const OpRun& r, const OpCase& c) {
    const int64_t rows = c.dims[0], width = c.dims[1];
    const VocabShard shard{c.dims[2], c.dims[3]};
    Tensor first = r.written({rows}), lse = r.written({rows});
    std::vector<OpResult> results;
    if (shard.whole == 0) {
      cross_entropy_forward(r.device(), r.in(0), r.in(1), first, lse);
      results = {result("losses", first), result("lse", lse)};
    } else {
      cross_entropy_shard_forward(r.device(), r.in(0), r.in(1), shard, lse, first);
      results = {result("target logits", first, Match::kExact), result("lse", lse)};
    }
    Tensor dlogits = r.written({rows, width}), in_place = r.updated(0),
           dbf16 = r.written({rows, width}, kBF16);
    cross_entropy_backward(r.device(), r.in(0), r.in(1), r.in(2), kCrossEntropyScale, dlogits,
                           shard);
    cross_entropy_backward(r.device(), in_place, r.in(1), r.in(2), kCrossEntropyScale, in_place,
                           shard);
    cross_entropy_backward(r.device(), r.in(0), r.in(1), r.in(2), kCrossEntropyScale, dbf16, shard);
    results.insert(results.end(), {result("dlogits", dlogits), result("dlogits in place", in_place),
                                   result("bf16 dlogits", dbf16)});
    // An lse near 1009 carries a rounding of 6e-5, which the losses inherit.
    if (c.dims[4] != 0)
      for (OpResult& x : results)
        if (x.dtype == kF32) x.tol = 1e-4;
    return results;
  };
  e.reference = [](const Values& in, const OpCase& c) {
    const int64_t rows = c.dims[0], width = c.dims[1], start = c.dims[2];
    const std::vector<int32_t> t = as_ids(in[1]);
    std::vector<double> first(rows), lse(rows), dlogits(rows * width);
    if (c.dims[3] == 0)
      cpu::cross_entropy_forward<double>(in[0].data(), t.data(), rows, width, first.data(),
                                         lse.data());
    else
      cpu::cross_entropy_shard_forward<double>(in[0].data(), t.data(), rows, width, start,
                                               lse.data(), first.data());
    cpu::cross_entropy_backward<double>(in[0].data(), t.data(), in[2].data(), kCrossEntropyScale,
                                        rows, width, start, dlogits.data());
    return Values{first, lse, dlogits, dlogits, dlogits};
  };
  // Nine rows: row 3 ignored (target -1), whose gradient must be zero.
  e.gradient_dims = {{9, 37, 0, 0, 0}};
  e.loss_result = 0;
  e.upstream = 3;
  e.gradients = {{0, 2}};
  return e;
}

}  // namespace

std::vector<OpEntry> routing_entries() {
  return {softmax_gating(), router_forward_entry(), sigmoid_router(),
          expert_choice(),  gshard_dispatch(),      router_z_loss(),
          router_aux(),     sequence_aux(),         cross_entropy()};
}

}  // namespace switchyard::testing
