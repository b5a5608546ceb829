// A SentencePiece model file: loaded, then used as training and `sample` use it (encode a
// line, decode the ids back).
#include <cstdint>
#include <string>

#include "data/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string name = "tokenizer.model";
  auto tokenizer = sy::Tokenizer::from_bytes(std::string(sy::fuzz::as_text(data, size)), name);
  sy::fuzz::require_clean_refusal(tokenizer.status(), name);
  if (!tokenizer.ok()) return 0;
  tokenizer->special_ids();
  const std::vector<int32_t> ids = tokenizer->encode("ROMEO: But soft, what light\n\t\xc3\xa9 1234");
  sy::fuzz::require_clean_refusal(tokenizer->decode(ids).status(), name);
  return 0;
}
