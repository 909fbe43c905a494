// Launches of an empty kernel: the floor under the host cost of every CUDA op (launch_floor.cu).
// CUDA builds only.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace fp8mla::cli {

struct LaunchFloorCase {
  std::string name;
  std::function<void()> launch;
};

std::vector<LaunchFloorCase> launch_floor_cases();

}  // namespace fp8mla::cli
