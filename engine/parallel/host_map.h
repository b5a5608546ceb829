// Which host each rank of a job runs on, for the line a run prints at start: a job whose
// ranks landed on unexpected nodes (two per GPU on one, none on another) shows it at once.
#pragma once

#include <string>
#include <vector>

#include "core/comm/communicator.h"

namespace switchyard {

// Every rank's host name, in rank order. A collective over `world`, whose tensors must be
// host tensors (call it before the groups move to a device communicator).
std::vector<std::string> gather_host_names(Communicator& world);

// Consecutive ranks on one host as one entry: "ranks 0-7 on node-a, rank 8 on node-b".
std::string describe_hosts(const std::vector<std::string>& hosts);

}  // namespace switchyard
