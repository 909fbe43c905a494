// Attention backends (docs/design.md section 4): what the MLA layer runs its attention and, where
// the backend has it, its BF16 -> FP8 transition through. A backend declares its capabilities; the
// layer states its requirements, and asking a backend for something it lacks is an error listing
// what was required, what the backend supports, what is missing, and the device.
//
// The optional hook prepare_prefill_qkv turns the layer's bf16 Q/K/V into FP8 (fused RoPE + e4m3
// Q and K, e4m3 V in the backend's V layout) and writes the FP8 latent cache; with it the layer
// runs the FP8 path, without it the BF16 path. pack_prefix_chunk_kv turns a prefix chunk's K/V to
// FP8.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8mla/attention.hpp"
#include "fp8mla/mla_prep.hpp"

namespace fp8mla {

struct BackendCapabilities {
  std::string name;
  std::vector<DType> attention_dtypes;         // of q, k, v
  std::vector<std::pair<int, int>> head_dims;  // (Dqk, Dv)
  int min_page_size = 1;
  int max_page_size = 128;
  // The output quantization keys its prefill_attention fuses, spelled as to_string(OutputQuantKey)
  // spells them (fp8mla/output_quant.hpp): every key for the shipped backends (the Hopper ones in
  // a build with their kernels). The MLA layer asks for fp8_group128 when it fuses o_proj's input
  // (asking a backend without it gives a "Missing: fused output quantization" error); without it
  // the layer quantizes separately.
  std::vector<std::string> output_quant;
  std::vector<std::string> architectures;  // "cpu", "sm_90a", ...
  bool prepare_prefill_qkv = false;
  bool pack_prefix_chunk_kv = false;
  VLayout v_layout = VLayout::kTokenMajor;  // of the FP8 V the hook and the pack write
  // Its prefill_attention folds a prior state into its output (PrefillAttentionArgs::prior_out,
  // prior_lse): true for the shipped backends. The MLA layer then merges each prefix chunk in
  // the chunk's attention call; without it, with merge_attention_states after the call.
  bool fold_prior_state = false;
};

struct BackendRequirements {
  DType attention_dtype = DType::kE4M3;
  int head_dim_qk = kMlaQkDim;
  int head_dim_v = kMlaVDim;
  int page_size = 64;
  std::string output_quant;  // empty: bf16 output
  bool prepare_prefill_qkv = false;
  bool pack_prefix_chunk_kv = false;
};

// Throws ErrorCategory::kUnsupported naming the backend, the required, supported and missing
// features, and `device` (the GPU's name for a CUDA device), unless `caps` covers `required`.
void check_backend(const BackendCapabilities& caps, const BackendRequirements& required,
                   Device device);

// The hook's arguments: RoPE + e4m3 Q/K with the latent cache write (as mla_rope_quantize_fp8
// takes them), and V: bf16 [T, H, 128] to e4m3 v_out (in the backend's v_layout) at v_scale_inv.
// V and v_out both left empty: V is already e4m3 where attention reads it (the MLA layer's FP8
// path writes it from kv_b_proj's GEMM) and the hook does Q and K alone.
struct PrepareQkvArgs {
  MlaRopeQuantizeArgs qk;
  TensorView v;
  float v_scale_inv = 1.0f;
  TensorView v_out;
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual const BackendCapabilities& capabilities() const = 0;
  virtual void prefill_attention(const PrefillAttentionArgs& args,
                                 CudaStream stream = nullptr) const = 0;
  // Optional capabilities; the defaults throw ErrorCategory::kUnsupported.
  virtual void prepare_prefill_qkv(const PrepareQkvArgs& args, CudaStream stream = nullptr) const;
  virtual void pack_prefix_chunk_kv(const MlaKvPackArgs& args, CudaStream stream = nullptr) const;
};

// "cpu" (FP8 hook and pack, e4m3 and bf16 attention), "cpu-bf16" (bf16 attention, no hook),
// "fp8-hopper" (the hook and pack writing V transposed, e4m3 and bf16 attention) or "bf16-hopper"
// (bf16 attention, no hook); another name is an ErrorCategory::kInvalidArgument error listing the
// known ones. Each runs fp8mla's ops, on the device of the tensors it is given. The Hopper ones
// declare the dtypes and head dims of the compiled kernel variants (compiled_attention_variants,
// fp8mla/kernel_registry.hpp) and the architecture they were built for: none in a build without
// CUDA, where check_backend rejects them.
std::unique_ptr<AttentionBackend> make_attention_backend(std::string_view name);
std::vector<std::string> attention_backend_names();

}  // namespace fp8mla
