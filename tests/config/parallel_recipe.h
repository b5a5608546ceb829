// The recipe the parallel-field tests start from: a small MoE model of a given depth
// whose `parallel` block holds the fields under test, and the check that each bad block
// is refused in one line naming the field.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config/recipe.h"

namespace switchyard::config::testing {

// A valid recipe named `name` with `num_layers` MoE layers and `parallel { <parallel> }`;
// a block that does not parse fails the test.
inline Recipe recipe_with_parallel(const std::string& name, int num_layers,
                                   const std::string& parallel) {
  const std::string text = absl::StrCat(
      "name: \"", name, "\"\n", "model { vocab_size: 512 hidden_size: 64 num_layers: ", num_layers,
      " num_heads: 4 moe_layer_interval: 1 }\n",
      "moe { num_experts: 4 top_k: 2 expert_ffn_hidden_size: 128 }\n", "optimizer { lr: 1e-3 }\n",
      "train { global_batch_size: 8 micro_batch_size: 2 seq_len: 32 steps: 10 }\n",
      "data { corpus: \"corpus.txt\" }\n", "parallel { ", parallel, " }\n");
  absl::StatusOr<Recipe> recipe = parse_recipe(text, name);
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return recipe.ok() ? *recipe : Recipe();
}

// (parallel block, part of the message it is refused with)
using ParallelRefusal = std::pair<std::string, std::string>;

// Each block is refused by validate_recipe in one line that holds its message.
inline void expect_parallel_refusals(const std::string& name, int num_layers,
                                     const std::vector<ParallelRefusal>& cases) {
  for (const auto& [parallel, message] : cases) {
    SCOPED_TRACE(parallel);
    const absl::Status status = validate_recipe(recipe_with_parallel(name, num_layers, parallel));
    ASSERT_FALSE(status.ok());
    EXPECT_NE(std::string(status.message()).find(message), std::string::npos) << status;
    EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos);
  }
}

}  // namespace switchyard::config::testing
