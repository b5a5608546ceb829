// CLI11 validators that read a numeric flag with core/runtime/numbers.h, so that every
// flag takes the spellings and gives the refusals a `--set` value does; CLI11 puts the
// flag's name first ("--tokens: 0 is out of range [1, 16777216]"). Each is a transform
// on an option bound to a typed variable, which keeps its default for --help:
//   sample->add_option("--tokens", tokens_, "...")->transform(integer_in(1, kMaxTokens));
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

#include "core/runtime/numbers.h"

namespace switchyard {

// An integer of [min, max], rewritten in plain decimal: CLI11's own conversion, which
// runs next, reads "010" as octal and "0x10" as hex; plain decimal it reads as parsed.
CLI::Validator integer_in(int64_t min, int64_t max);

// A seed: any integer of [0, 2^64 - 1], as train.seed.
CLI::Validator seed_value();

// A finite real number inside `range` (numbers.h's spellings are ones CLI11 reads alike).
CLI::Validator real_in(const RealRange& range);

// A size with an optional unit, at least one byte (the flag stays text: read it again
// with parse_size_with_units).
CLI::Validator size_with_units();

}  // namespace switchyard
