// The largest vocabulary any input may declare: a recipe's model, a tokenizer, a dataset
// index, a token shard, a Hugging Face config. Published models stay below 2^18.
#pragma once

#include <cstdint>

namespace switchyard {

inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;

}  // namespace switchyard
