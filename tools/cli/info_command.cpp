// `fp8mla info`: the build and the CUDA devices this process can see.
#include <cstdio>
#include <vector>

#include "commands.hpp"
#include "fp8mla/kernel_registry.hpp"
#include "fp8mla/runtime_info.hpp"

namespace fp8mla::cli {
namespace {

void print_info() {
  const BuildInfo build = build_info();
  std::printf("fp8mla %s\n", build.version.c_str());
  std::printf("  build:    %s, %s\n", build.build_type.c_str(), build.compiler.c_str());
  if (build.cuda) {
    std::printf("  cuda:     on (CUDA %s, device code for %s)\n", build.cuda_version.c_str(),
                build.cuda_arch.c_str());
  } else {
    std::printf("  cuda:     off (CPU-only build)\n");
  }
  const std::vector<AttentionVariantKey> variants = compiled_attention_variants();
  std::printf("  attention kernels: %s\n", variants.empty() ? "none (CPU only)" : "");
  for (const AttentionVariantKey& key : variants) std::printf("    %s\n", to_string(key).c_str());
  const CudaDevices cuda = cuda_devices();
  if (cuda.devices.empty()) {
    std::printf("  devices:  no CUDA device (%s)\n", cuda.unavailable_reason.c_str());
    return;
  }
  std::printf("  devices:\n");
  for (const CudaDeviceInfo& d : cuda.devices) {
    std::printf("    cuda:%d  %s  sm_%d  %d SMs  L2 %.0f MiB  %.1f GiB\n", d.ordinal,
                d.name.c_str(), d.arch, d.sm_count, double(d.l2_bytes) / (1 << 20),
                double(d.global_memory_bytes) / (1 << 30));
  }
}

}  // namespace

void add_info_command(CLI::App& app) {
  app.add_subcommand("info", "Print the build options and the CUDA devices fp8mla can use")
      ->callback(print_info);
}

}  // namespace fp8mla::cli
