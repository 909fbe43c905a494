// `fp8mla run --tp N --cp M`: one process drives all N * M ranks of a tensor-parallel (heads) by
// context-parallel (tokens) layer, each rank on its own thread (and on the GPU its own device),
// so that it needs no launcher and can compare the ranks' assembled output with the one-rank
// layer and the float64 reference in the same run. Rank (t, c) is TP rank t of N and CP rank c
// of M; on the GPU it runs on device c * N + t.
#pragma once

#include "fp8mla/mla_weights.hpp"
#include "run_common.hpp"

namespace fp8mla::cli {

// Before any work: on the GPU (`gpu`), N * M CUDA devices, else a kUnsupported error saying how
// many the machine has.
void check_parallel_devices(const RunOptions& opt, bool gpu);
// Once the layer's config and weight format are known: every rank's shard (check_mla_tensor_
// parallel) and the options the parallel run does not take (--calibrate).
void check_parallel_run(const RunOptions& opt, const MlaConfig& config, WeightFormat format);

// The report of the parallel run: both paths' stage times (the slowest rank's per stage) and
// the assembled output's accuracy against float64 and against the one-rank layer's output.
void run_parallel_on_cpu(const MlaConfig& config, const MlaWeights& weights, const RunOptions& opt,
                         Report& r);
#if defined(FP8MLA_WITH_CUDA)
void run_parallel_on_gpu(const MlaConfig& config, const MlaWeights& weights, const RunOptions& opt,
                         Report& r);
#endif

}  // namespace fp8mla::cli
