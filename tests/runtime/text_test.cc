// Text made safe to print: control bytes escaped in errors, generated text made UTF-8.
#include "core/runtime/text.h"

#include <gtest/gtest.h>

namespace switchyard {
namespace {

TEST(TextTest, ControlBytesAreEscaped) {
  EXPECT_EQ(escape_control_bytes("a\nb\x1b[31m"), "a\\x0ab\\x1b[31m");
}

TEST(TextTest, WellFormedUtf8IsKept) {
  const std::string text = "plain, caf\xc3\xa9, \xe2\x82\xac, \xf0\x9f\x98\x80, \xf4\x8f\xbf\xbf";
  EXPECT_EQ(to_valid_utf8(text), text);
}

TEST(TextTest, EveryIllFormedByteBecomesAReplacementCharacter) {
  const std::string r = "\xef\xbf\xbd";
  EXPECT_EQ(to_valid_utf8("a\xc3"), "a" + r);                  // cut short at the end
  EXPECT_EQ(to_valid_utf8("\xc3(x"), r + "(x");                // bad continuation
  EXPECT_EQ(to_valid_utf8("\xc0\xaf"), r + r);                 // overlong
  EXPECT_EQ(to_valid_utf8("\xed\xa0\x80"), r + r + r);         // a surrogate
  EXPECT_EQ(to_valid_utf8("\xf4\x90\x80\x80"), r + r + r + r); // above U+10FFFF
  EXPECT_EQ(to_valid_utf8("\xff"), r);
}

}  // namespace
}  // namespace switchyard
