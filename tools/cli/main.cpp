#include <cstdio>
#include <exception>

#include "commands.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/version.hpp"

int main(int argc, char** argv) {
  CLI::App app{"fp8mla: FP8 Multi-head Latent Attention prefill for NVIDIA Hopper"};
  app.set_version_flag("--version", fp8mla::kVersionString);
  app.require_subcommand(1);
  fp8mla::cli::add_info_command(app);
#if defined(FP8MLA_WITH_MODEL)
  fp8mla::cli::add_run_command(app);
#endif
  CLI::App* bench = app.add_subcommand("bench", "Time fp8mla's ops (CUDA kernels on cuda:0)");
  bench->require_subcommand(1);
  fp8mla::cli::add_bench_host_command(*bench);
#if defined(FP8MLA_WITH_CUDA)
  fp8mla::cli::add_bench_quant_command(*bench);
  fp8mla::cli::add_bench_prep_command(*bench);
  fp8mla::cli::add_bench_attention_command(*bench);
  fp8mla::cli::add_bench_output_quant_command(*bench);
  fp8mla::cli::add_bench_projection_command(*bench);
#if defined(FP8MLA_WITH_MODEL)
  fp8mla::cli::add_bench_layer_command(*bench);
#endif
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const fp8mla::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8mla: %s\n", e.what());
    return 1;
  }
  return 0;
}
