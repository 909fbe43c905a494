// MLA prefill preparation ops (docs/design.md section 3, ops 4-7): the kernels a backend's
// prepare_prefill_qkv hook is made of. Conventions as in quantize.hpp: TensorViews on one device,
// caller-allocated outputs written in full, 0 tokens valid, bad arguments throw fp8mla::Error
// (scales by value must be finite and > 0; outputs may not overlap inputs).
//
// Exact arithmetic (the CPU implementation and the CUDA kernels agree bit for bit):
//   RoPE of a pair (x0, x1) with c = cos[pos][i], s = sin[pos][i], in fp32:
//     y0 = fma(x0, c, -(x1 * s)),  y1 = fma(x1, c, x0 * s)
//   interleaved pairs (2i, 2i+1) (DeepSeek); NeoX pairs (i, i + rope_dim / 2).
//   FP8: q = e4m3(x * scale_inv) (numerics.hpp: nearest-even, saturating).
//   Dequantization: x = bf16(decode_e4m3(q) * scale).
#pragma once

#include <cstdint>
#include <optional>

#include "fp8mla/stream.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla {

inline constexpr int kMlaNopeDim = 128;     // per-head non-RoPE part of Q and K
inline constexpr int kMlaRopeDim = 64;      // RoPE part; K's is shared by all heads
inline constexpr int kMlaQkDim = 192;       // kMlaNopeDim + kMlaRopeDim
inline constexpr int kMlaVDim = 128;        // value head dim
inline constexpr int kMlaKvLoraRank = 512;  // width of the compressed latent kv_c
inline constexpr int kMlaLatentDim = 576;   // one cached token: kv_c then k_pe

enum class RopeStyle {
  kInterleaved,  // pairs (2i, 2i + 1), as DeepSeek uses
  kNeox,         // pairs (i, i + rope_dim / 2)
};

// DeepSeek-V3's rope_scaling (type "yarn"). A config that leaves mscale or mscale_all_dim out has
// 0 there (transformers reads an absent one as false).
struct YarnScaling {
  double factor = 40.0;
  std::int64_t original_max_position = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 1.0;
};

struct RopeConfig {
  int rope_dim = kMlaRopeDim;
  double theta = 10000.0;
  std::optional<YarnScaling> yarn;  // plain RoPE when empty
};

// Fills `cos_sin`, f32 [max_pos, rope_dim] = [cos(rope_dim/2) | sin(rope_dim/2)] for positions
// 0..max_pos-1, computed in double and rounded once (on the host; a CUDA view is filled by a
// blocking copy: this is set-up work, not a per-request op).
void make_cos_sin_cache(const TensorView& cos_sin, const RopeConfig& config,
                        CudaStream stream = nullptr);

// The factor YaRN multiplies cos and sin by (transformers' attention_factor from DeepSeek's keys):
// mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are non-zero, else
// mscale(factor, 1), where mscale(f, m) = 0.1 * m * ln(f) + 1 (1 for f <= 1). 1 for DeepSeek's
// configs, which set the two equal.
double yarn_attention_factor(const YarnScaling& yarn);

// The factor YaRN applies to the softmax scale: scale = qk_dim^-0.5 * mscale^2, where mscale =
// 0.1 * mscale_all_dim * ln(factor) + 1 (1 without YaRN or with factor <= 1).
double softmax_mscale(const RopeConfig& config);

// Where a latent row (kv_c then the RoPE'd k_pe, FP8) goes: slot s is row s % page_size of page
// s / page_size of `cache`, e4m3 [num_pages, page_size, 576] (rows contiguous, any page and row
// strides). A slot of -1 is skipped. Any other slot outside [0, num_pages * page_size) is an
// error: the CPU path throws before writing; the CUDA path cannot throw without a sync, so it
// skips that token and sets `error_flag` (one i32 on the device, written 1, never cleared by the
// op) when one is given.
struct LatentCacheWrite {
  TensorView cache;         // e4m3 [num_pages, page_size, 576]
  TensorView slot_mapping;  // i32 or i64 [T]
  float scale_inv = 1.0f;   // cache = e4m3(x * scale_inv)
  TensorView error_flag;    // optional (data == nullptr: none)
};

// ---- 4. Fused RoPE + FP8 Q and K -----------------------------------------------------------
struct MlaRopeQuantizeArgs {
  TensorView q_nope;     // [T, H, 128] bf16/f16, any strides with a contiguous last dim
  TensorView q_pe;       // [T, H, 64]
  TensorView k_nope;     // [T, H, 128]
  TensorView k_pe;       // [T, 64] or [T, 1, 64]: shared by all heads
  TensorView positions;  // i32 or i64 [T]
  TensorView cos_sin;    // f32 [max_pos, 64] (make_cos_sin_cache)
  RopeStyle style = RopeStyle::kInterleaved;
  float q_scale_inv = 1.0f;
  float k_scale_inv = 1.0f;
  TensorView q_out;  // e4m3 [T, H, 192] = [nope | rope], any token/head strides
  TensorView k_out;  // e4m3 [T, H, 192]
  // Optional: in the same pass, write kv_c (bf16/f16 [T, 512]) and the RoPE'd k_pe to the cache.
  std::optional<LatentCacheWrite> cache_write;
  TensorView kv_c;  // needed with cache_write
  // Optional: K split as prefill_attention's k_rope takes it. k_out is then e4m3 [T, H, 128]
  // (k_nope alone) and the RoPE'd k_pe goes here once per token, e4m3 [T, 64] or [T, 1, 64]
  // (any token stride, contiguous last dim): the same bytes as every head's k_out[..., 128:].
  // k_nope may be left empty: K's nope part is then not this op's (the MLA layer's FP8 path
  // writes it in e4m3 from kv_b_proj's GEMM), and k_out receives K's RoPE part alone (bytes
  // 128.. of each head), or is left empty too with k_rope_out.
  TensorView k_rope_out;
};

// For each token t (p = positions[t]) and head h:
//   q_out[t, h] = [e4m3(q_nope[t, h] * q_scale_inv) | e4m3(rope(q_pe[t, h], p) * q_scale_inv)]
//   k_out[t, h] = [e4m3(k_nope[t, h] * k_scale_inv) | e4m3(rope(k_pe[t], p) * k_scale_inv)]
//   (with k_rope_out: k_out[t, h] = e4m3(k_nope[t, h] * k_scale_inv) and
//    k_rope_out[t] = e4m3(rope(k_pe[t], p) * k_scale_inv))
// and with cache_write the latent row of slot_mapping[t]:
//   [e4m3(kv_c[t] * scale_inv) | e4m3(rope(k_pe[t], p) * scale_inv)]
// All inputs share one dtype (bf16 or f16). A position outside [0, max_pos) is an error: the CPU
// path throws before writing anything; the CUDA path writes that token's q_out and k_out rows as
// zeros, skips its cache row and sets cache_write's error_flag (when given). Slots: see
// LatentCacheWrite. The cache row's RoPE part is rounded once from fp32, so it need not equal
// what mla_kv_cache_write writes from a k_pe the caller RoPE'd and rounded to bf16 first.
void mla_rope_quantize_fp8(const MlaRopeQuantizeArgs& args, CudaStream stream = nullptr);

// ---- 5. Latent cache write -----------------------------------------------------------------
// kv_c bf16/f16 [T, 512] and the already RoPE'd k_pe [T, 64] (or [T, 1, 64]) into the cache.
// Slots not in slot_mapping stay bit-identical. Page sizes 1 to 128.
void mla_kv_cache_write(const TensorView& kv_c, const TensorView& k_pe,
                        const LatentCacheWrite& write, CudaStream stream = nullptr);

// ---- 6. Latent cache gather ----------------------------------------------------------------
// The latent rows of `slots` (i32/i64 [n], each in range; a bad slot is an error as above, and
// its output rows are written as zeros on the CUDA path) back to bf16:
// kv_c_out [n, 512] and k_pe_out [n, 64] = bf16(decode(q) * scale).
void mla_kv_gather(const TensorView& cache, const TensorView& slots, float scale,
                   const TensorView& kv_c_out, const TensorView& k_pe_out,
                   const TensorView& error_flag = {}, CudaStream stream = nullptr);

// ---- 7. Prefix-chunk K/V pack --------------------------------------------------------------
// Layout of the packed V. v_out is always a logical [n, H, 128] view; the layout says how its
// memory is ordered.
enum class VLayout {
  kTokenMajor,  // contiguous last dim, like the input
  // Contiguous tokens: a [n, H, 128] view of [H][128][>= n] memory (token stride 1, head stride
  // >= 128 x dim stride, dim stride >= n), what FP8 prefill_attention on Hopper reads.
  kTransposed,
};

// The token pitch fp8mla gives a transposed V of `tokens` tokens (the layer's workspace, Python's
// allocated outputs): `tokens` rounded up to 16, at least 16, so that each dim's row of keys
// starts 16-byte aligned as TMA reads it. Any pitch >= tokens that is a multiple of 16 works.
std::int64_t transposed_v_pitch(std::int64_t tokens);

// The e4m3 [tokens, heads, 128] view of transposed V memory [heads][128][pitch] at `data`
// (strides {1, 128 * pitch, pitch}), as VLayout::kTransposed lays it out.
TensorView transposed_v_view(void* data, std::int64_t tokens, std::int64_t heads,
                             std::int64_t pitch, Device device);

struct MlaKvPackArgs {
  TensorView k_nope;  // [n, H, 128] bf16/f16, strided (e.g. a slice of kv_b_proj's output)
  TensorView k_pe;    // [n, 64] or [n, 1, 64]: broadcast to every head
  TensorView v;       // [n, H, 128], strided
  float k_scale_inv = 1.0f;
  float v_scale_inv = 1.0f;
  TensorView k_out;  // e4m3 [n, H, 192] = [k_nope | k_pe]; [n, H, 128] with k_rope_out
  TensorView v_out;  // e4m3, laid out as v_layout says
  VLayout v_layout = VLayout::kTokenMajor;
  // Optional: K split as prefill_attention's k_rope takes it. k_out then holds k_nope alone and
  // k_pe goes here once per token, e4m3 [n, 64] or [n, 1, 64] (any token stride, contiguous last
  // dim): the same bytes as every head's k_out[..., 128:] without it.
  TensorView k_rope_out;
};

void mla_kv_pack_quantize_fp8(const MlaKvPackArgs& args, CudaStream stream = nullptr);

// V alone to e4m3 in `layout` (the V half of mla_kv_pack_quantize_fp8, same arithmetic and the
// same checks on v and v_out): v [n, H, 128] bf16/f16 (any token/head strides, contiguous last
// dim); v_out e4m3 [n, H, 128] laid out as `layout` says:
//   v_out[t, h] = e4m3(v[t, h] * v_scale_inv)
// For a backend whose K comes from mla_rope_quantize_fp8. 0 tokens or 0 heads: nothing to do.
void mla_v_quantize_fp8(const TensorView& v, const TensorView& v_out, float v_scale_inv,
                        VLayout layout, CudaStream stream = nullptr);

}  // namespace fp8mla
