// Names read from files stay inside the directory the user named: symlinks that lead out
// are refused, except into the blobs of a Hugging Face hub cache snapshot, and only there.
#include "core/runtime/file_util.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace switchyard {
namespace {

namespace fs = std::filesystem;

// A hub cache in a fresh directory: <root>/models--org--tiny/{blobs,snapshots/rev}, one
// blob `config-hash`, linked from the snapshot as config.json the way the hub links it.
class HubCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "switchyard-file-util-XXXXXX").string();
    root_ = mkdtemp(tmpl.data());
    fs::create_directories(blobs());
    fs::create_directories(snapshot());
    write(blobs() / "config-hash");
    link_from(snapshot(), "config.json", "../../blobs/config-hash");
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path repo() const { return root_ / "models--org--tiny"; }
  fs::path blobs() const { return repo() / "blobs"; }
  fs::path snapshot() const { return repo() / "snapshots" / "rev"; }
  static void write(const fs::path& path) { std::ofstream(path) << "{}"; }
  static void link_from(const fs::path& dir, const std::string& name, const fs::path& target) {
    fs::create_symlink(target, dir / name);
  }
  static std::string error_of(const fs::path& dir, const std::string& name) {
    const absl::StatusOr<std::string> path = path_in_directory(dir.string(), name, "index");
    return path.ok() ? "accepted" : std::string(path.status().message());
  }

  fs::path root_;
};

TEST_F(HubCacheTest, SnapshotFileLinkedIntoBlobsIsAccepted) {
  const absl::StatusOr<std::string> path =
      path_in_directory(snapshot().string(), "config.json", "index");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, (snapshot() / "config.json").string());
}

TEST_F(HubCacheTest, LinkThroughBlobsToElsewhereIsRefused) {
  write(root_ / "elsewhere");
  link_from(snapshot(), "x", "../../blobs/../../elsewhere");
  EXPECT_NE(error_of(snapshot(), "x").find("leads outside"), std::string::npos)
      << error_of(snapshot(), "x");
}

TEST_F(HubCacheTest, LinkIntoBlobsFromOutsideSnapshotsIsRefused) {
  const fs::path other = repo() / "other" / "rev";
  fs::create_directories(other);
  link_from(other, "config.json", "../../blobs/config-hash");
  EXPECT_NE(error_of(other, "config.json").find("leads outside"), std::string::npos)
      << error_of(other, "config.json");
}

TEST_F(HubCacheTest, BlobThatLinksOutIsRefused) {
  write(root_ / "outside");
  link_from(blobs(), "out-hash", root_ / "outside");
  link_from(snapshot(), "model.safetensors", "../../blobs/out-hash");
  EXPECT_NE(error_of(snapshot(), "model.safetensors").find("leads outside"), std::string::npos)
      << error_of(snapshot(), "model.safetensors");
}

TEST_F(HubCacheTest, FifoInBlobsIsRefused) {
  ASSERT_EQ(mkfifo((blobs() / "fifo-hash").c_str(), 0644), 0);
  link_from(snapshot(), "tokenizer.model", "../../blobs/fifo-hash");
  EXPECT_NE(error_of(snapshot(), "tokenizer.model").find("is not a regular file"),
            std::string::npos)
      << error_of(snapshot(), "tokenizer.model");
}

TEST_F(HubCacheTest, BlobsDirectoryThatIsASymlinkIsRefused) {
  const fs::path elsewhere = root_ / "elsewhere-blobs";
  fs::create_directories(elsewhere);
  write(elsewhere / "config-hash");
  fs::remove_all(blobs());
  fs::create_directory_symlink(elsewhere, blobs());
  EXPECT_NE(error_of(snapshot(), "config.json").find("leads outside"), std::string::npos)
      << error_of(snapshot(), "config.json");
}

TEST_F(HubCacheTest, PlainNamesOnly) {
  EXPECT_NE(error_of(snapshot(), "../../blobs/config-hash").find("is not a plain file name"),
            std::string::npos);
  EXPECT_NE(error_of(snapshot(), "..").find("is not a plain file name"), std::string::npos);
}

TEST_F(HubCacheTest, OrdinaryDirectoryKeepsItsFilesInside) {
  const fs::path dir = root_ / "weights";
  fs::create_directories(dir);
  write(dir / "model.safetensors");
  link_from(dir, "inside", "model.safetensors");
  link_from(dir, "outside", blobs() / "config-hash");
  EXPECT_EQ(error_of(dir, "inside"), "accepted");
  EXPECT_NE(error_of(dir, "outside").find("leads outside"), std::string::npos)
      << error_of(dir, "outside");
}

}  // namespace
}  // namespace switchyard
