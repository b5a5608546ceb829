// HDF5 token shards: what is written reads back, the element type follows the
// vocabulary size, and damaged shards are errors that name the file.
#include "data/token_shard.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "data/hdf5_handle.h"
#include "tests/data/data_test_util.h"

namespace switchyard {
namespace {

using ::switchyard::testing::find_in_file;
using ::switchyard::testing::IsOneLineWith;
using ::switchyard::testing::message_of;
using ::switchyard::testing::patch_file;
using ::switchyard::testing::ScratchDir;

ShardAttributes attributes_for(int64_t vocab_size) {
  ShardAttributes a;
  a.tokenizer_sha256 = "0123abcd";
  a.vocab_size = vocab_size;
  a.special_ids = kTrainedSpecialIds;
  return a;
}

// Writes documents of ids and returns the shard's path.
std::string write_shard(const ScratchDir& dir, int64_t vocab_size,
                        const std::vector<std::vector<int32_t>>& documents) {
  const std::string path = dir / "shard.h5";
  auto writer = ShardWriter::create(path, attributes_for(vocab_size));
  EXPECT_TRUE(writer.ok()) << writer.status();
  for (const auto& doc : documents)
    EXPECT_TRUE((*writer)->append_document(doc.data(), static_cast<int64_t>(doc.size())).ok());
  EXPECT_TRUE((*writer)->close().ok());
  return path;
}

TEST(TokenShardTest, DtypeSwitchesAtTheUint16Boundary) {
  EXPECT_EQ(token_dtype_for_vocab(1000), TokenDType::kUint16);
  EXPECT_EQ(token_dtype_for_vocab(65536), TokenDType::kUint16);
  EXPECT_EQ(token_dtype_for_vocab(65537), TokenDType::kUint32);
  for (const int64_t vocab : {int64_t{65536}, int64_t{65537}, int64_t{1} << 20}) {
    ScratchDir dir;
    const int32_t top = static_cast<int32_t>(vocab - 1);
    const std::string path = write_shard(dir, vocab, {{0, 1, top}, {top, 65535, 2}});
    auto reader = ShardReader::open(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->dtype(), token_dtype_for_vocab(vocab));
    std::vector<int32_t> ids(6);
    ASSERT_TRUE((*reader)->read_tokens(0, 6, ids.data()).ok());
    EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, top, top, 65535, 2}));
    EXPECT_EQ(*(*reader)->scan_max_token(), top);
  }
}

TEST(TokenShardTest, RoundTripsTokensOffsetsAndAttributes) {
  ScratchDir dir;
  // More than one 1 Mi-token chunk, so appends cross chunk boundaries.
  std::vector<std::vector<int32_t>> docs;
  std::vector<int32_t> all;
  for (int d = 0; d < 3; ++d) {
    std::vector<int32_t> doc(700'000 + d);
    for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>((i * 7 + d) % 1000);
    all.insert(all.end(), doc.begin(), doc.end());
    docs.push_back(std::move(doc));
  }
  const std::string path = write_shard(dir, 1000, docs);
  auto reader = ShardReader::open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const ShardReader& r = **reader;
  EXPECT_EQ(r.dtype(), TokenDType::kUint16);
  EXPECT_EQ(r.num_tokens(), static_cast<int64_t>(all.size()));
  EXPECT_EQ(r.num_documents(), 3);
  EXPECT_EQ(r.attributes().tokenizer_sha256, "0123abcd");
  EXPECT_EQ(r.attributes().vocab_size, 1000);
  EXPECT_EQ(r.attributes().special_ids, kTrainedSpecialIds);
  EXPECT_EQ(r.attributes().format_version, kTokenFormatVersion);
  EXPECT_EQ(*r.read_doc_offsets(), (std::vector<int64_t>{0, 700'000, 1'400'001, 2'100'003}));
  std::vector<int32_t> back(all.size());
  ASSERT_TRUE(r.read_tokens(0, r.num_tokens(), back.data()).ok());
  EXPECT_EQ(back, all);
  std::vector<int32_t> part(10);
  ASSERT_TRUE(r.read_tokens(1'048'570, 10, part.data()).ok());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + 1'048'570));
}

TEST(TokenShardTest, WriterRejectsIdsOutsideTheVocabulary) {
  ScratchDir dir;
  auto writer = ShardWriter::create(dir / "s.h5", attributes_for(100));
  ASSERT_TRUE(writer.ok());
  const int32_t ids[] = {5, 100};
  EXPECT_TRUE(IsOneLineWith(message_of((*writer)->append_document(ids, 2)), "token id 100"));
}

TEST(TokenShardTest, IdAtOrAboveVocabSizeIsAnErrorWithPosition) {
  ScratchDir dir;
  // A run of id 0x0309 marks where the tokens lie in the file; one becomes 0xFFFF.
  std::vector<int32_t> doc(64, 0x0309);
  const std::string path = write_shard(dir, 1000, {doc});
  std::string run;
  for (int i = 0; i < 64; ++i) run += "\x09\x03";
  const int64_t offset = find_in_file(path, run);
  ASSERT_GE(offset, 0);
  patch_file(path, offset + 2 * 10, "\xFF\xFF");
  auto reader = ShardReader::open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int32_t> ids(64);
  const absl::Status status = (*reader)->read_tokens(0, 64, ids.data());
  EXPECT_TRUE(IsOneLineWith(message_of(status), path + ": token 10 has id 65535"));
  EXPECT_TRUE(IsOneLineWith(message_of((*reader)->scan_max_token().status()), path));
}

TEST(TokenShardTest, DamagedFilesAreErrorsNamingTheFile) {
  ScratchDir dir;
  const std::string path = write_shard(dir, 1000, {{1, 2, 3}, {4, 5}});
  const std::string good = testing::read_text(path);

  testing::write_text(path, good.substr(0, good.size() / 2));
  EXPECT_TRUE(IsOneLineWith(message_of(ShardReader::open(path).status()),
                            path + ": truncated: its superblock records"));
  testing::write_text(path, "plain text, not HDF5");
  EXPECT_TRUE(IsOneLineWith(message_of(ShardReader::open(path).status()), path));
  testing::write_text(path, good);
  patch_file(path, 0, "garbage!");
  EXPECT_TRUE(IsOneLineWith(message_of(ShardReader::open(path).status()), path));
  EXPECT_TRUE(IsOneLineWith(message_of(ShardReader::open(dir / "missing.h5").status()),
                            dir / "missing.h5"));
}

// Opens a written shard for editing with the HDF5 C API.
H5Handle open_for_edit(const std::string& path) {
  silence_hdf5_errors();
  return H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
}

TEST(TokenShardTest, ExtentsLargerThanTheFileAreRefusedBeforeAllocating) {
  ScratchDir dir;
  const std::string path = write_shard(dir, 1000, {{1, 2, 3}});
  {
    H5Handle file = open_for_edit(path);
    H5Ldelete(file.get(), "tokens", H5P_DEFAULT);
    const hsize_t huge = hsize_t{1} << 40;
    H5Handle space(H5Screate_simple(1, &huge, nullptr), H5Sclose);
    H5Handle tokens(H5Dcreate2(file.get(), "tokens", H5T_STD_U16LE, space.get(), H5P_DEFAULT,
                               H5P_DEFAULT, H5P_DEFAULT),
                    H5Dclose);
    ASSERT_TRUE(tokens.valid());
  }
  EXPECT_TRUE(IsOneLineWith(message_of(ShardReader::open(path).status()),
                            path + ": /tokens: its 2199023255552 bytes of data are not inside the file"));
}

TEST(TokenShardTest, MoreDocumentOffsetsThanTokensAreRefused) {
  ScratchDir dir;
  const std::string path = write_shard(dir, 1000, {{1, 2, 3}});
  {
    H5Handle file = open_for_edit(path);
    H5Ldelete(file.get(), "doc_offsets", H5P_DEFAULT);
    const std::vector<int64_t> offsets(10, 0);
    const hsize_t n = offsets.size();
    H5Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    H5Handle dataset(H5Dcreate2(file.get(), "doc_offsets", H5T_STD_I64LE, space.get(),
                                H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                     H5Dclose);
    ASSERT_GE(H5Dwrite(dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                       offsets.data()),
              0);
  }
  EXPECT_TRUE(IsOneLineWith(message_of(ShardReader::open(path).status()),
                            path + ": /doc_offsets has 10 entries; its 3 tokens allow 1 to 4"));
}

TEST(TokenShardTest, AttributesAreSingleValuesInRange) {
  ScratchDir dir;
  const std::string path = write_shard(dir, 1000, {{1, 2, 3}});
  const std::string good = testing::read_text(path);
  auto set_attribute = [&](const char* name, const std::vector<int64_t>& values) {
    testing::write_text(path, good);
    H5Handle file = open_for_edit(path);
    H5Adelete(file.get(), name);
    const hsize_t n = values.size();
    H5Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    H5Handle attr(
        H5Acreate2(file.get(), name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
        H5Aclose);
    H5Awrite(attr.get(), H5T_NATIVE_INT64, values.data());
  };
  set_attribute("vocab_size", std::vector<int64_t>(4000, 1000));
  EXPECT_TRUE(IsOneLineWith(message_of(ShardReader::open(path).status()),
                            path + ": attribute vocab_size: must hold exactly one value"));
  set_attribute("vocab_size", {int64_t{1} << 40});
  EXPECT_TRUE(IsOneLineWith(message_of(ShardReader::open(path).status()),
                            path + ": attribute vocab_size 1099511627776 is outside"));
  set_attribute("eos_id", {1000});
  EXPECT_TRUE(IsOneLineWith(message_of(ShardReader::open(path).status()),
                            path + ": attribute eos_id is 1000, outside [-1, vocab_size 1000)"));
}

TEST(TokenShardTest, ImagesOpenWithTheSameChecks) {
  ScratchDir dir;
  const std::string path = write_shard(dir, 1000, {{1, 2, 3}, {4, 5}});
  const std::string good = testing::read_text(path);
  auto reader = ShardReader::open_image(good, "image.h5");
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->num_tokens(), 5);
  EXPECT_EQ((*reader)->num_documents(), 2);
  EXPECT_EQ(*(*reader)->scan_max_token(), 5);
  EXPECT_TRUE(
      IsOneLineWith(message_of(ShardReader::open_image(good.substr(0, 200), "cut.h5").status()),
                    "cut.h5: truncated"));
}

TEST(TokenShardTest, SpecialFilesAreRefusedWithoutBlocking) {
  ScratchDir dir;
  ASSERT_EQ(mkfifo((dir / "fifo.h5").c_str(), 0600), 0);
  EXPECT_TRUE(IsOneLineWith(message_of(ShardReader::open(dir / "fifo.h5").status()),
                            "is not a regular file"));
}

}  // namespace
}  // namespace switchyard
