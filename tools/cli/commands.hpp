// Subcommands of the fp8mla tool; each registers itself on the app and runs from its callback.
#pragma once

#include <CLI/CLI.hpp>

namespace fp8mla::cli {

void add_info_command(CLI::App& app);
#if defined(FP8MLA_WITH_MODEL)
// `fp8mla run`: one MLA layer prefill, FP8 vs BF16 vs a float64 reference (the main job).
void add_run_command(CLI::App& app);
#endif

// `fp8mla bench host`: the C++ API's host time per call of each op (every build).
void add_bench_host_command(CLI::App& bench);
#if defined(FP8MLA_WITH_CUDA)
// `fp8mla bench quant` (registered on the `bench` subcommand; CUDA builds only).
void add_bench_quant_command(CLI::App& bench);
// `fp8mla bench prep`: the MLA prep ops (CUDA builds only).
void add_bench_prep_command(CLI::App& bench);
// `fp8mla bench attention`: prefill attention in TFLOP/s (CUDA builds only).
void add_bench_attention_command(CLI::App& bench);
// `fp8mla bench output-quant`: fused output quantization vs attention + the quantization op.
void add_bench_output_quant_command(CLI::App& bench);
// `fp8mla bench projection`: kv_b_proj's bf16-output GEMM vs its e4m3-output pair.
void add_bench_projection_command(CLI::App& bench);
#if defined(FP8MLA_WITH_MODEL)
// `fp8mla bench layer`: the MLA layer's FP8 and BF16 paths (CUDA builds with the model).
void add_bench_layer_command(CLI::App& bench);
#endif
#endif

}  // namespace fp8mla::cli
