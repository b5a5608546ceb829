#include "engine/parallel/host_map.h"

#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace switchyard {
namespace {

// Bytes each rank sends: Linux host names are at most 64 bytes (HOST_NAME_MAX), so one
// more always leaves a terminating zero.
constexpr int64_t kHostNameBytes = 256;

std::string own_host_name() {
  char name[kHostNameBytes] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

}  // namespace

std::vector<std::string> gather_host_names(Communicator& world) {
  Tensor mine = Tensor::zeros({kHostNameBytes}, DType::kU8);
  const std::string name = own_host_name();
  std::memcpy(mine.data<uint8_t>(), name.data(), name.size());
  Tensor all = Tensor::empty({world.size() * kHostNameBytes}, DType::kU8);
  world.all_gather(mine, all);
  std::vector<std::string> hosts;
  for (int r = 0; r < world.size(); ++r) {
    const char* bytes = reinterpret_cast<const char*>(all.data<uint8_t>() + r * kHostNameBytes);
    hosts.emplace_back(bytes, strnlen(bytes, kHostNameBytes));
  }
  return hosts;
}

std::string describe_hosts(const std::vector<std::string>& hosts) {
  std::vector<std::string> runs;
  size_t first = 0;
  for (size_t r = 1; r <= hosts.size(); ++r) {
    if (r < hosts.size() && hosts[r] == hosts[first]) continue;
    const std::string ranks = r - first == 1 ? absl::StrCat("rank ", first)
                                             : absl::StrCat("ranks ", first, "-", r - 1);
    runs.push_back(absl::StrCat(ranks, " on ", hosts[first]));
    first = r;
  }
  return absl::StrJoin(runs, ", ");
}

}  // namespace switchyard
