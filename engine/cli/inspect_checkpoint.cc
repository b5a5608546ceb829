#include "engine/cli/inspect_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <map>

#include "checkpoint/checkpoint.h"
#include "core/config/recipe.h"
#include "core/runtime/status_macros.h"

namespace switchyard {

namespace fs = std::filesystem;

bool is_checkpoint(const std::string& path) {
  return fs::exists(fs::path(path) / "manifest.pb") || fs::exists(fs::path(path) / "latest");
}

absl::Status inspect_checkpoint(const std::string& path) {
  std::string dir = path;
  if (!fs::exists(fs::path(path) / "manifest.pb")) {
    SY_ASSIGN_OR_RETURN(dir, latest_checkpoint(path));
  }
  SY_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest, read_manifest(dir));
  const checkpoint::SavedLayout& layout = manifest.layout();
  std::printf("%s: checkpoint at step %lld (loader epoch %lld, window %lld)\n", dir.c_str(),
              static_cast<long long>(manifest.step()),
              static_cast<long long>(manifest.loader().epoch()),
              static_cast<long long>(manifest.loader().position()));
  std::printf("  %s\n", config::summarize_recipe(manifest.recipe()).c_str());
  std::printf("  saved by %d ranks: tp %d, dp %d, ep %d, zero stage %d\n", layout.world_size(),
              layout.tensor_parallel_size(), layout.data_parallel_size(),
              layout.expert_parallel_size(), layout.zero_stage());
  struct Entry {
    std::string shape;
    int slices = 0;
    int64_t bytes = 0;
  };
  std::map<std::string, Entry> tensors;
  int64_t total_bytes = 0;
  for (const checkpoint::TensorSlice& s : manifest.slices()) {
    Entry& e = tensors[s.tensor()];
    e.shape = shape_string(Shape(s.global_shape().begin(), s.global_shape().end()));
    int64_t row = 1;
    for (int i = 1; i < s.global_shape_size(); ++i) row *= s.global_shape(i);
    e.bytes += s.rows() * row * 4;
    ++e.slices;
    total_bytes += s.rows() * row * 4;
  }
  for (const auto& [name, e] : tensors)
    std::printf("  %-70s %-22s %d slice%s %10.3f MB\n", name.c_str(), e.shape.c_str(), e.slices,
                e.slices == 1 ? " " : "s", e.bytes / 1048576.0);
  std::printf("  %zu tensors, %.3f MB\n", tensors.size(), total_bytes / 1048576.0);
  SY_ASSIGN_OR_RETURN(const int64_t verified, verify_checkpoint(dir, manifest));
  std::printf("  checksums: %lld slices verified\n", static_cast<long long>(verified));
  return absl::OkStatus();
}

}  // namespace switchyard
