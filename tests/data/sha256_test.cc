// SHA-256 against known digests (FIPS 180-2 examples and hashlib), in one piece and fed
// in awkward pieces that straddle the 64-byte blocks.
#include "data/sha256.h"

#include <gtest/gtest.h>

#include <string>

namespace switchyard {
namespace {

struct KnownDigest {
  std::string message;
  std::string hex;
};

std::vector<KnownDigest> known_digests() {
  std::string bytes;
  for (int i = 0; i < 41; ++i)
    for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  return {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {std::string(1000000, 'a'),
       "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
      {bytes, "ab6b9b1d71dcfec981b828ca8b9d280b6cf90fb42d788542331933d444aed8cf"},
  };
}

TEST(Sha256Test, MatchesKnownDigests) {
  for (const KnownDigest& k : known_digests())
    EXPECT_EQ(sha256_hex(k.message), k.hex) << k.message.size() << " bytes";
}

TEST(Sha256Test, PiecesGiveTheSameDigest) {
  for (const KnownDigest& k : known_digests()) {
    for (size_t piece : {1, 7, 63, 64, 65, 1000}) {
      Sha256 h;
      for (size_t at = 0; at < k.message.size(); at += piece)
        h.update(std::string_view(k.message).substr(at, piece));
      EXPECT_EQ(h.hex_digest(), k.hex) << k.message.size() << " bytes in pieces of " << piece;
    }
  }
}

}  // namespace
}  // namespace switchyard
