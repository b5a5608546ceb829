// Outputs against inputs: an output that is, lies inside or contains an input (symlinks
// followed) is refused naming both; an input the output owns may lie inside it; an existing
// file is replaced only with --overwrite and only when it is of the output's kind.
#include "core/runtime/output_paths.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace switchyard {
namespace {

namespace fs = std::filesystem;

class OutputPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "switchyard-output-paths-XXXXXX").string();
    root_ = mkdtemp(tmpl.data());
    fs::create_directories(root_ / "in");
    write("in/data.txt", "data");
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const std::string& name, const std::string& text) {
    std::ofstream(root_ / name) << text;
  }
  std::string at(const std::string& name) const { return (root_ / name).string(); }
  // A file output whose kind is a file holding "mine".
  OutputPath file(const std::string& name) const {
    return output_file("--out", at(name), "file of mine",
                       [](const std::string& path) { return file_starts_with(path, "mine"); });
  }
  std::string refusal(const std::vector<InputPath>& inputs, const OutputPath& out,
                      bool overwrite = false) const {
    const absl::Status status = check_outputs(inputs, {out}, overwrite);
    return status.ok() ? std::string("ok") : std::string(status.message());
  }

  fs::path root_;
};

TEST_F(OutputPathsTest, OutputThatIsAnInputIsRefusedNamingBoth) {
  const std::string message = refusal({{"--input", at("in/data.txt")}}, file("in/data.txt"));
  EXPECT_NE(message.find("--out " + at("in/data.txt") + " is the input " + at("in/data.txt")),
            std::string::npos)
      << message;
}

TEST_F(OutputPathsTest, SymlinksAreFollowed) {
  fs::create_directory_symlink(root_ / "in", root_ / "link");
  EXPECT_NE(refusal({{"DIR", at("in")}}, output_directory("OUT", at("link"))).find("is the input"),
            std::string::npos);
}

TEST_F(OutputPathsTest, OutputInsideOrContainingAnInputIsRefused) {
  EXPECT_NE(refusal({{"DIR", at("in")}}, file("in/new.txt")).find("lies inside the input"),
            std::string::npos);
  EXPECT_NE(refusal({{"--input", at("in/data.txt")}}, output_directory("OUT", root_.string()))
                .find("contains the input"),
            std::string::npos);
}

TEST_F(OutputPathsTest, OnlyTheEntriesADirectoryWritesMayNotHoldInputs) {
  const OutputPath run = output_directory("--run-dir", root_.string(), {"checkpoints"});
  EXPECT_EQ(refusal({{"data.dataset", at("in")}}, run), "ok");
  fs::create_directories(root_ / "checkpoints" / "final");
  EXPECT_NE(refusal({{"train.init_from", at("checkpoints/final")}}, run).find("contains"),
            std::string::npos);
  EXPECT_EQ(refusal({{"--resume-from", at("checkpoints/final"), /*owned=*/true}}, run), "ok");
}

TEST_F(OutputPathsTest, ExistingFileNeedsOverwriteAndItsKind) {
  write("mine.txt", "mine, written before");
  EXPECT_NE(refusal({}, file("mine.txt")).find("exists: --overwrite"), std::string::npos);
  EXPECT_EQ(refusal({}, file("mine.txt"), /*overwrite=*/true), "ok");
  EXPECT_NE(refusal({}, file("in/data.txt"), /*overwrite=*/true).find("is not a file of mine"),
            std::string::npos);
}

TEST_F(OutputPathsTest, TwoOutputsThatAreOnePathAreRefused) {
  const absl::Status status = check_outputs({}, {file("a.json"), file("a.json")}, false);
  EXPECT_NE(std::string(status.message()).find("is also --out"), std::string::npos) << status;
}

TEST_F(OutputPathsTest, DirectoryOutputOverAFileOrNonEmptyIsRefused) {
  EXPECT_NE(refusal({}, output_directory("OUT", at("in/data.txt"))).find("is not a directory"),
            std::string::npos);
  const OutputPath must_be_empty = output_directory("OUT", at("in"), {}, true);
  EXPECT_NE(refusal({}, must_be_empty).find("not empty"), std::string::npos);
  EXPECT_EQ(refusal({}, must_be_empty, /*overwrite=*/true), "ok");
}

TEST_F(OutputPathsTest, SymlinkInsideADirectoryIsRefusedNamingIt) {
  fs::create_symlink(root_ / "in" / "data.txt", root_ / "metrics.jsonl");
  const absl::Status status = refuse_symlink(at("metrics.jsonl"), root_.string());
  EXPECT_NE(std::string(status.message()).find(at("metrics.jsonl") + ": is a symbolic link"),
            std::string::npos)
      << status;
  EXPECT_TRUE(refuse_symlink(at("in/data.txt"), root_.string()).ok());
}

}  // namespace
}  // namespace switchyard
