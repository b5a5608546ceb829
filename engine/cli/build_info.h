// What `switchyard --version` prints.
#pragma once

#include <string>

namespace switchyard {

// One line: the version (CMakeLists.txt's project), the git commit the binary was built
// from ("unknown" outside a git checkout), the build type and whether the CUDA backend
// is built.
std::string build_info_line();

}  // namespace switchyard
