// Every number a user types (a command-line flag of any command, a `--set` override) is
// read here, so that a spelling means the same everywhere and a refusal has one shape:
// "<field>: <text> <what is wrong>", e.g.
//   --tokens: 99999999999999999999 is out of range [1, 16777216]
//   train.seed: -1 must be a non-negative integer
// An empty `field` leaves the naming to the caller (CLI11 puts the flag's name first).
//
// Spellings. An integer is an optional '-' and decimal digits, nothing else: no '+', no
// whitespace, no hex, no exponent or fraction ("1e3" and "0x10" are refused; "010" is
// ten). A real number is an optional '-', digits with an optional fraction and exponent
// ("1.5", ".5", "2e-3"); it must be finite ("nan", "inf" are refused). A size is a real
// number of bytes followed by nothing or one unit, in any case: B, KB (also kB), MB, GB,
// TB (powers of 1000, as transformers' save_pretrained) or KiB, MiB, GiB, TiB (powers of
// 1024); it is at least one byte, and a fraction of a byte is dropped. A value outside its
// range is refused, never clamped or wrapped.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace switchyard {

// An integer of [min, max].
absl::StatusOr<int64_t> parse_int64(absl::string_view text, absl::string_view field, int64_t min,
                                    int64_t max);

// A non-negative integer of [0, max] (seeds take the whole 64 bits).
absl::StatusOr<uint64_t> parse_uint64(absl::string_view text, absl::string_view field,
                                      uint64_t max = std::numeric_limits<uint64_t>::max());

// The bounds of a real number; an open end excludes its value: (0, 1] is {0, 1, true}.
struct RealRange {
  double min;
  double max;
  bool min_open = false;
  bool max_open = false;
};

// A finite real number inside `range`.
absl::StatusOr<double> parse_double(absl::string_view text, absl::string_view field,
                                    const RealRange& range);

// The most bytes a size may name: 2^60, beyond any device's memory or any file.
inline constexpr int64_t kMaxSizeBytes = int64_t{1} << 60;

// A size with an optional unit, in whole bytes of [1, max_bytes].
absl::StatusOr<int64_t> parse_size_with_units(absl::string_view text, absl::string_view field,
                                              int64_t max_bytes = kMaxSizeBytes);

// A sum or product computed from user numbers (a prompt's tokens + --tokens, train.steps x
// train.global_batch_size x train.seq_len), checked before use: refused when it leaves
// [min, max] or int64, in the shape above with the terms for the field and their values for
// the text, e.g.
//   train.steps x train.global_batch_size x train.seq_len: 4611686018427387904 x 4 x 32 is
//   out of range [1, 9223372036854775807]
struct NamedNumber {
  absl::string_view name;
  int64_t value;
};
absl::StatusOr<int64_t> checked_sum(std::initializer_list<NamedNumber> terms, int64_t min,
                                    int64_t max);
absl::StatusOr<int64_t> checked_product(std::initializer_list<NamedNumber> factors, int64_t min,
                                        int64_t max);

}  // namespace switchyard
