// Plain parameters of merge_attention_states (fp8mla/attention.hpp, op 9): what the argument
// checks in merge_states.cpp produce and what the CPU implementation and the CUDA kernel consume.
#pragma once

#include <cstdint>

#include "fp8mla/dtype.hpp"
#include "fp8mla/stream.hpp"
#include "ops/output_quant_params.hpp"

namespace fp8mla {

struct MergeStatesParams {
  // [T, H, D] rows of D contiguous elements; row (t, h) starts at data + t * token_stride +
  // h * head_stride elements.
  struct States {
    void* data = nullptr;
    std::int64_t token_stride = 0;
    std::int64_t head_stride = 0;
  };
  // f32 [T, H]; element (t, h) at data[t * token_stride + h * head_stride].
  struct Lse {
    float* data = nullptr;
    std::int64_t token_stride = 0;
    std::int64_t head_stride = 0;
  };
  DType dtype = DType::kF32;  // of o_a, o_b and out: bf16 or f32
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  std::int64_t dim = 0;
  States o_a, o_b, out;  // out may be o_a (in place); then out_lse is lse_a
  Lse lse_a, lse_b, out_lse;
  // A quantized `out` (then `out` above is unset): the CUDA kernel writes it directly; the CPU
  // path merges into a buffer and quantizes that (ops/merge_states.cpp).
  OutputQuantParams quant;
  // Optional i32 on the op's device: the real tokens of a batch padded to `tokens`; only rows
  // [0, *num_tokens) are merged (docs/design.md section 6). nullptr: all of them.
  const std::int32_t* num_tokens = nullptr;
};

namespace cpu {
void merge_attention_states(const MergeStatesParams& p);
}  // namespace cpu

namespace cuda {
void merge_attention_states(const MergeStatesParams& p, CudaStream stream);
}  // namespace cuda

}  // namespace fp8mla
