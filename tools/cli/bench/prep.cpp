// `fp8mla bench prep`: times the MLA prefill preparation ops (docs/design.md section 3, ops 4-7) on
// CUDA device 0 through the public C++ API and the default stream, next to a device-to-device copy
// of the same byte count measured the same way. Same method and JSON shape as `fp8mla bench quant`.
//
// Layouts are those of an engine (DeepSeek-V3, H = 128 by default): q is [T, H, 192] bf16 and the
// op reads q_nope = q[..., :128] and q_pe = q[..., 128:]; kv (kv_b_proj's output) is [T, H, 256]
// with k_nope = kv[..., :128] and v = kv[..., 128:]; the latent kv_a is [T, 576] with
// kv_c = kv_a[:, :512] and k_pe = kv_a[:, 512:]; the FP8 cache is [pages, page_size, 576].
//
// Method (see bench/README.md): CUDA events around each launch, `--warmup` untimed launches, then
// `--iters` timed ones, median. Unlike `bench quant`, the timed launches are by default all queued
// behind a host gate and then run back to back (EventTimer's `queued`), so a launch shorter than
// the host's time to issue it (T <= 64: a few µs) is timed as device time; `--host-paced` times
// it as `bench quant` does. Every launch uses the next of a ring of buffer sets whose counted
// bytes total more than 2x the L2, so no launch finds its data in the L2; each set has its own
// positions (distinct, so each reads its own cos/sin rows) and its own slots (the set's cache
// pages in a random order, tokens in order within a page, as a sequence's pages lie in an
// engine's cache). Inputs are random non-zero bf16 (the gather's cache: their FP8 encodings).
// Bytes = every input read once + every output written once, counted exactly (the fewest any
// implementation must move; unread halves of the strided parents are not counted). After
// timing, the first tokens of one set are compared bit for bit with the CPU implementation, and
// the error flag the CUDA ops set on a bad position or slot must still be 0.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "bench/harness.hpp"
#include "commands.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"

namespace fp8mla::cli {
namespace {

// Token counts: 1 to 128k (the prefill sizes of section 9's targets: <= 64 and >= 8k).
constexpr std::int64_t kTokens[] = {1, 16, 64, 256, 1024, 4096, 8192, 16384, 65536, 131072};
constexpr std::int64_t kMaxPositions = 163840;  // DeepSeek-V3's max_position_embeddings
constexpr float kScaleInv = 16.0f;  // |x| < 16, |rope(x)| < 16 * sqrt(2): * 16 < 363 < 448
constexpr float kGatherScale = 1.0f / 16.0f;
constexpr std::int64_t kCheckTokens = 8;  // tokens compared with the CPU implementation

constexpr std::int64_t kQWidth = kMlaQkDim;                // q [T, H, 192]
constexpr std::int64_t kKvWidth = kMlaNopeDim + kMlaVDim;  // kv [T, H, 256]
constexpr std::int64_t kLatent = kMlaLatentDim;            // kv_a [T, 576], cache rows
constexpr std::int64_t kCosSinRowBytes = kMlaRopeDim * 4;  // one f32 row of cos_sin
constexpr std::int64_t kIndexBytes = 8;                    // positions and slots are int64

enum class Op { kRope, kRopeCache, kCacheWrite, kGather, kPack };

using OpInfo = OpEntry<Op>;

constexpr OpInfo kOps[] = {
    {Op::kRope, "rope_quant",  // op 4
     "mla_rope_quantize_fp8: RoPE + FP8 of Q and K (q_nope, q_pe of q [T,H,192]; k_nope of kv "
     "[T,H,256]; shared k_pe of kv_a [T,576]) into q_out, k_out [T,H,192] e4m3"},
    {Op::kRopeCache, "rope_quant_cache",  // op 4 with op 5 fused
     "mla_rope_quantize_fp8 with the fused latent cache write (kv_c and the RoPE'd k_pe into "
     "the paged FP8 cache)"},
    {Op::kCacheWrite, "kv_cache_write",  // op 5
     "mla_kv_cache_write: kv_c and k_pe of kv_a [T,576] bf16 into the paged FP8 cache"},
    {Op::kGather, "kv_gather",  // op 6
     "mla_kv_gather: T cached latent rows back to bf16 kv_c [T,512] and k_pe [T,64] (views of "
     "one [T,576] buffer)"},
    {Op::kPack, "kv_pack",  // op 7
     "mla_kv_pack_quantize_fp8: k_nope, v of kv [n,H,256] and k_pe [n,64] into k [n,H,192] and "
     "v [n,H,128] e4m3"},
};

bool uses_cache(Op op) {
  return op == Op::kRopeCache || op == Op::kCacheWrite || op == Op::kGather;
}
bool is_rope(Op op) {
  return op == Op::kRope || op == Op::kRopeCache;
}

struct Config {
  std::int64_t heads = 128;
  std::int64_t page_size = 64;
  RopeStyle style = RopeStyle::kInterleaved;
};

// ---- Buffers ("roles") and byte counts of one (op, T) ------------------------------------------

enum class Fill {
  kRandomBf16,  // random non-zero bf16
  kRandomFp8,   // FP8 encodings of random non-zero bf16 (the gather's cache)
  kPositions,   // int64 positions, distinct per set
  kSlots,       // int64 slots into the set's cache
  kOutput,      // poisoned with 0xFF before timing
};

struct Role {
  const char* name;
  std::int64_t bytes;  // allocation per set
  Fill fill;
};

std::int64_t pages_of(std::int64_t tokens, const Config& c) {
  return std::max<std::int64_t>(1, (tokens + c.page_size - 1) / c.page_size);
}
std::int64_t cache_bytes(std::int64_t tokens, const Config& c) {
  return pages_of(tokens, c) * c.page_size * kLatent;
}

// Role indices, per op.
namespace rope {
enum : int { kQ, kKv, kKvA, kPositions, kQOut, kKOut, kCache, kSlots };
}
namespace write {
enum : int { kKvA, kSlots, kCache };
}
namespace gather {
enum : int { kCache, kSlots, kOut };
}
namespace pack {
enum : int { kKv, kKPe, kKOut, kVOut };
}

std::vector<Role> roles_of(Op op, std::int64_t t, const Config& c) {
  const std::int64_t h = c.heads;
  switch (op) {
    case Op::kRope:
    case Op::kRopeCache: {
      std::vector<Role> roles = {
          {"q", t * h * kQWidth * 2, Fill::kRandomBf16},
          {"kv", t * h * kKvWidth * 2, Fill::kRandomBf16},
          {"kv_a", t * kLatent * 2, Fill::kRandomBf16},
          {"positions", t * kIndexBytes, Fill::kPositions},
          {"q_out", t * h * kQWidth, Fill::kOutput},
          {"k_out", t * h * kQWidth, Fill::kOutput},
      };
      if (op == Op::kRopeCache) {
        roles.push_back({"cache", cache_bytes(t, c), Fill::kOutput});
        roles.push_back({"slots", t * kIndexBytes, Fill::kSlots});
      }
      return roles;
    }
    case Op::kCacheWrite:
      return {{"kv_a", t * kLatent * 2, Fill::kRandomBf16},
              {"slots", t * kIndexBytes, Fill::kSlots},
              {"cache", cache_bytes(t, c), Fill::kOutput}};
    case Op::kGather:
      return {{"cache", cache_bytes(t, c), Fill::kRandomFp8},
              {"slots", t * kIndexBytes, Fill::kSlots},
              {"out", t * kLatent * 2, Fill::kOutput}};
    case Op::kPack:
      return {{"kv", t * h * kKvWidth * 2, Fill::kRandomBf16},
              {"k_pe", t * kMlaRopeDim * 2, Fill::kRandomBf16},
              {"k_out", t * h * kQWidth, Fill::kOutput},
              {"v_out", t * h * kMlaVDim, Fill::kOutput}};
  }
  return {};
}

struct ByteCount {
  std::int64_t in = 0;   // inputs read (cos_sin rows, positions and slots included)
  std::int64_t out = 0;  // outputs written
  std::int64_t total() const { return in + out; }
};

ByteCount count_bytes(Op op, std::int64_t t, const Config& c) {
  const std::int64_t h = c.heads;
  switch (op) {
    case Op::kRope:
    case Op::kRopeCache: {
      // q_nope + q_pe + k_nope (bf16), the shared k_pe once per token, positions, one cos_sin row
      // per token (positions are distinct); q_out and k_out.
      ByteCount b{t * h * (kMlaNopeDim + kMlaRopeDim + kMlaNopeDim) * 2 + t * kMlaRopeDim * 2 +
                      t * kIndexBytes + t * kCosSinRowBytes,
                  2 * t * h * kQWidth};
      if (op == Op::kRopeCache) {  // + kv_c and slots read, one latent row written per token
        b.in += t * kMlaKvLoraRank * 2 + t * kIndexBytes;
        b.out += t * kLatent;
      }
      return b;
    }
    case Op::kCacheWrite:
      return {t * kLatent * 2 + t * kIndexBytes, t * kLatent};
    case Op::kGather:
      return {t * kLatent + t * kIndexBytes, t * kLatent * 2};
    case Op::kPack:
      return {t * h * kKvWidth * 2 + t * kMlaRopeDim * 2, t * h * (kQWidth + kMlaVDim)};
  }
  return {};
}

// ---- Views and the call on one buffer set ------------------------------------------------------

// The arguments of one call on one set, but for the cos/sin table and the error flag.
struct Views {
  MlaRopeQuantizeArgs rope;
  TensorView kv_c, k_pe, cache, slots;  // cache write (and the rope's fused write)
  TensorView kv_c_out, k_pe_out;        // gather
  MlaKvPackArgs pack;
};

// The views of one set over `p` (data pointers per role, as roles_of() orders them) for T tokens,
// on `device` (a CPU view of host copies takes the same layouts).
Views views_of(Op op, std::int64_t t, const Config& c, std::byte* const* p, Device device,
               std::int64_t cache_pages) {
  const std::int64_t h = c.heads;
  Views v;
  auto bf16 = [&](std::byte* base, std::int64_t offset, std::initializer_list<std::int64_t> shape,
                  std::initializer_list<std::int64_t> strides) {
    return TensorView(base + offset * 2, DType::kBF16, shape, strides, device);
  };
  auto cache = [&](std::byte* base) {
    return TensorView(base, DType::kE4M3, {cache_pages, c.page_size, kLatent}, device);
  };
  auto slots = [&](std::byte* base) { return TensorView(base, DType::kI64, {t}, device); };
  switch (op) {
    case Op::kRope:
    case Op::kRopeCache:
      v.rope.q_nope = bf16(p[rope::kQ], 0, {t, h, kMlaNopeDim}, {h * kQWidth, kQWidth, 1});
      v.rope.q_pe = bf16(p[rope::kQ], kMlaNopeDim, {t, h, kMlaRopeDim}, {h * kQWidth, kQWidth, 1});
      v.rope.k_nope = bf16(p[rope::kKv], 0, {t, h, kMlaNopeDim}, {h * kKvWidth, kKvWidth, 1});
      v.rope.k_pe = bf16(p[rope::kKvA], kMlaKvLoraRank, {t, kMlaRopeDim}, {kLatent, 1});
      v.rope.positions = TensorView(p[rope::kPositions], DType::kI64, {t}, device);
      v.rope.style = c.style;
      v.rope.q_scale_inv = v.rope.k_scale_inv = kScaleInv;
      v.rope.q_out = TensorView(p[rope::kQOut], DType::kE4M3, {t, h, kQWidth}, device);
      v.rope.k_out = TensorView(p[rope::kKOut], DType::kE4M3, {t, h, kQWidth}, device);
      if (op == Op::kRopeCache) {  // cache_write is set with the error flag in run_op
        v.rope.kv_c = bf16(p[rope::kKvA], 0, {t, kMlaKvLoraRank}, {kLatent, 1});
        v.cache = cache(p[rope::kCache]);
        v.slots = slots(p[rope::kSlots]);
      }
      break;
    case Op::kCacheWrite:
      v.kv_c = bf16(p[write::kKvA], 0, {t, kMlaKvLoraRank}, {kLatent, 1});
      v.k_pe = bf16(p[write::kKvA], kMlaKvLoraRank, {t, kMlaRopeDim}, {kLatent, 1});
      v.slots = slots(p[write::kSlots]);
      v.cache = cache(p[write::kCache]);
      break;
    case Op::kGather:
      v.cache = cache(p[gather::kCache]);
      v.slots = slots(p[gather::kSlots]);
      v.kv_c_out = bf16(p[gather::kOut], 0, {t, kMlaKvLoraRank}, {kLatent, 1});
      v.k_pe_out = bf16(p[gather::kOut], kMlaKvLoraRank, {t, kMlaRopeDim}, {kLatent, 1});
      break;
    case Op::kPack:
      v.pack.k_nope = bf16(p[pack::kKv], 0, {t, h, kMlaNopeDim}, {h * kKvWidth, kKvWidth, 1});
      v.pack.v = bf16(p[pack::kKv], kMlaNopeDim, {t, h, kMlaVDim}, {h * kKvWidth, kKvWidth, 1});
      v.pack.k_pe = TensorView(p[pack::kKPe], DType::kBF16, {t, kMlaRopeDim}, device);
      v.pack.k_scale_inv = v.pack.v_scale_inv = kScaleInv;
      v.pack.k_out = TensorView(p[pack::kKOut], DType::kE4M3, {t, h, kQWidth}, device);
      v.pack.v_out = TensorView(p[pack::kVOut], DType::kE4M3, {t, h, kMlaVDim}, device);
      break;
  }
  return v;
}

// One call of `op` on `v`. `error_flag` is an i32 [1] view (or empty).
void run_op(Op op, const Views& v, const TensorView& cos_sin, const TensorView& error_flag) {
  switch (op) {
    case Op::kRope:
    case Op::kRopeCache: {
      MlaRopeQuantizeArgs args = v.rope;
      args.cos_sin = cos_sin;
      if (op == Op::kRopeCache) {
        args.cache_write = LatentCacheWrite{v.cache, v.slots, kScaleInv, error_flag};
      }
      mla_rope_quantize_fp8(args);
      return;
    }
    case Op::kCacheWrite:
      mla_kv_cache_write(v.kv_c, v.k_pe, LatentCacheWrite{v.cache, v.slots, kScaleInv, error_flag});
      return;
    case Op::kGather:
      mla_kv_gather(v.cache, v.slots, kGatherScale, v.kv_c_out, v.k_pe_out, error_flag);
      return;
    case Op::kPack:
      mla_kv_pack_quantize_fp8(v.pack);
      return;
  }
}

// ---- Index fills -------------------------------------------------------------------------------

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Set s: positions (s * T + t) mod max_pos (distinct within a set while T <= max_pos).
std::vector<std::int64_t> positions_of(std::int64_t t, int set) {
  std::vector<std::int64_t> pos(static_cast<std::size_t>(t));
  for (std::int64_t i = 0; i < t; ++i)
    pos[std::size_t(i)] = (std::int64_t(set) * t + i) % kMaxPositions;
  return pos;
}

// Set s: token i goes to row i % page_size of page perm[i / page_size], perm a random
// permutation of the set's pages.
std::vector<std::int64_t> slots_of(std::int64_t t, const Config& c, int set) {
  const std::int64_t pages = pages_of(t, c);
  std::vector<std::int64_t> perm(static_cast<std::size_t>(pages));
  std::iota(perm.begin(), perm.end(), std::int64_t(0));
  std::uint64_t state = std::uint64_t(set) * 0x1000193ull + std::uint64_t(t);
  for (std::int64_t i = pages - 1; i > 0; --i) {
    state = mix(state);
    std::swap(perm[std::size_t(i)], perm[std::size_t(state % std::uint64_t(i + 1))]);
  }
  std::vector<std::int64_t> slots(static_cast<std::size_t>(t));
  for (std::int64_t i = 0; i < t; ++i) {
    slots[std::size_t(i)] = perm[std::size_t(i / c.page_size)] * c.page_size + i % c.page_size;
  }
  return slots;
}

void upload(std::byte* dst, const std::vector<std::int64_t>& values) {
  cuda::check(
      cudaMemcpy(dst, values.data(), values.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice),
      "cudaMemcpy(indices)");
}

// The device cache rows of `slots`, one after another (what a cache op wrote for those tokens).
std::vector<std::byte> cache_rows(const std::byte* cache, const std::vector<std::int64_t>& slots) {
  std::vector<std::byte> rows(slots.size() * std::size_t(kLatent));
  for (std::size_t i = 0; i < slots.size(); ++i) {
    cuda::check(cudaMemcpy(rows.data() + i * kLatent, cache + slots[i] * kLatent,
                           std::size_t(kLatent), cudaMemcpyDeviceToHost),
                "cudaMemcpy(check cache row)");
  }
  return rows;
}

// ---- Run ---------------------------------------------------------------------------------------

struct Options : CommonOptions {
  std::vector<std::int64_t> tokens;
  std::string style = "interleaved";
  std::int64_t heads = 128;
  std::int64_t page_size = 64;
  bool host_paced = false;
};

const char* style_name(RopeStyle s) {
  return s == RopeStyle::kNeox ? "neox" : "interleaved";
}

MemoryResult describe(const OpInfo& info, std::int64_t tokens, const Config& c) {
  const ByteCount b = count_bytes(info.op, tokens, c);
  MemoryResult r;
  r.op = info.name;
  r.shape = concat("T=", tokens, " H=", c.heads);
  r.label = info.what;
  r.fields = JsonFields()
                 .add("tokens", tokens)
                 .add("heads", c.heads)
                 .add("bytes", b.total())
                 .add("bytes_in", b.in)
                 .add("bytes_out", b.out)
                 .inner();
  r.bytes = b.total();
  return r;
}

// The prep ops' state on the device: the cos/sin table, the error flag the ops set on a bad
// position or slot.
class PrepRunner {
 public:
  PrepRunner(MemoryBench& bench, const Config& config)
      : bench_(bench),
        config_(config),
        host_cos_sin_(std::size_t(kMaxPositions * kMlaRopeDim)),
        cos_sin_buffer_(kMaxPositions * kCosSinRowBytes),
        flag_(4) {
    // DeepSeek-V3's YaRN cos/sin, built on the host (the same values the CPU check uses).
    RopeConfig rope;
    rope.yarn = YarnScaling{};
    make_cos_sin_cache(TensorView(host_cos_sin_.data(), DType::kF32, {kMaxPositions, kMlaRopeDim}),
                       rope);
    cuda::check(cudaMemcpy(cos_sin_buffer_.data(), host_cos_sin_.data(),
                           std::size_t(cos_sin_buffer_.bytes()), cudaMemcpyHostToDevice),
                "cudaMemcpy(cos_sin)");
    cuda::check(cudaMemset(flag_.data(), 0, 4), "cudaMemset(error flag)");
  }

  void measure(Op op, std::int64_t tokens, MemoryResult& res) {
    const std::vector<Role> roles = roles_of(op, tokens, config_);
    std::vector<std::int64_t> role_bytes;
    std::int64_t allocated = 0;
    for (const Role& r : roles) {
      role_bytes.push_back(r.bytes);
      allocated += round_up(std::max<std::int64_t>(r.bytes, 1), 256);
    }
    // Enough sets that the bytes the op touches (not the allocations, which include the unread
    // halves of q/kv's parents) total more than 2x the L2.
    const std::int64_t counted = std::max<std::int64_t>(1, res.bytes);
    const std::int64_t min_total =
        std::int64_t(double(bench_.rotation_bytes()) * double(allocated) / double(counted)) + 1;
    const RotatingSets sets(role_bytes, min_total);
    res.sets = sets.sets();
    prepare(tokens, roles, sets);
    const std::int64_t pages = pages_of(tokens, config_);
    const TensorView cos_sin(cos_sin_buffer_.data(), DType::kF32, {kMaxPositions, kMlaRopeDim},
                             Device::cuda(0));
    const TensorView flag(flag_.data(), DType::kI32, {1}, Device::cuda(0));
    std::vector<Views> views;  // made before timing: views are host-side structs
    std::vector<std::byte*> ptrs;
    for (int s = 0; s < sets.sets(); ++s) {
      sets.pointers(s, ptrs);
      views.push_back(views_of(op, tokens, config_, ptrs.data(), Device::cuda(0), pages));
    }
    res.us = bench_.time_us(
        [&](int k) { run_op(op, views[std::size_t(k % sets.sets())], cos_sin, flag); });
    res.check = bench_.options().no_check ? "not checked" : check_against_cpu(op, tokens, sets);
    std::int32_t flag_value = 0;
    cuda::check(cudaMemcpy(&flag_value, flag_.data(), 4, cudaMemcpyDeviceToHost),
                "cudaMemcpy(error flag)");
    if (flag_value != 0) {
      res.check = concat("ERROR FLAG SET (a position or slot out of range); ", res.check);
      cuda::check(cudaMemset(flag_.data(), 0, 4), "cudaMemset(error flag)");
    }
  }

 private:
  // Fills every role of every set: random inputs, per-set indices, poisoned outputs.
  void prepare(std::int64_t tokens, const std::vector<Role>& roles, const RotatingSets& sets) {
    for (int role = 0; role < sets.roles(); ++role) {
      const Role& r = roles[std::size_t(role)];
      switch (r.fill) {
        case Fill::kRandomBf16:
          bench_.pool().fill(sets.region(role), sets.region_bytes(role),
                             std::uint64_t(tokens) * 31 + std::uint64_t(role));
          break;
        case Fill::kRandomFp8:
          fill_random_e4m3(bench_.pool(), sets.region(role), sets.region_bytes(role), 1.0f,
                           std::uint64_t(tokens) * 131, 1);
          break;
        case Fill::kPositions:
          for (int s = 0; s < sets.sets(); ++s) upload(sets.at(role, s), positions_of(tokens, s));
          break;
        case Fill::kSlots:
          for (int s = 0; s < sets.sets(); ++s) {
            upload(sets.at(role, s), slots_of(tokens, config_, s));
          }
          break;
        case Fill::kOutput:
          poison(sets, role);
          break;
      }
    }
    cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (fill)");
  }

  // Host copies of each role of set 0, shrunk to n tokens: token-major roles keep their first n
  // tokens' bytes; the cache is rebuilt with one row per checked token (slot i = row i), from the
  // GPU's rows of `gpu_slots` for the gather; outputs are poisoned (the CPU op must write them in
  // full).
  std::vector<std::vector<std::byte>> host_copies(Op op, std::int64_t tokens, std::int64_t n,
                                                  const RotatingSets& sets,
                                                  const std::vector<std::int64_t>& gpu_slots) {
    const std::vector<Role> roles = roles_of(op, tokens, config_);
    std::vector<std::vector<std::byte>> host(roles.size());
    for (std::size_t role = 0; role < roles.size(); ++role) {
      const Role& r = roles[role];
      if (uses_cache(op) && r.name == std::string_view("cache")) {
        host[role].assign(std::size_t(pages_of(n, config_) * config_.page_size * kLatent),
                          std::byte{0});
        if (op == Op::kGather) {
          const std::vector<std::byte> rows = cache_rows(sets.at(int(role), 0), gpu_slots);
          std::copy(rows.begin(), rows.end(), host[role].begin());
        }
        continue;
      }
      if (r.fill == Fill::kSlots) {
        std::vector<std::int64_t> identity(static_cast<std::size_t>(n));
        std::iota(identity.begin(), identity.end(), std::int64_t(0));
        host[role].resize(std::size_t(n) * 8);
        std::memcpy(host[role].data(), identity.data(), host[role].size());
      } else {
        host[role] = to_host<std::byte>(sets.at(int(role), 0), n * (r.bytes / tokens));
      }
      if (r.fill == Fill::kOutput) std::fill(host[role].begin(), host[role].end(), std::byte{0xFF});
    }
    return host;
  }

  // The first kCheckTokens tokens of set 0: inputs copied to the host, the CPU op run on them,
  // outputs compared byte for byte (cache ops: the cache rows of those tokens' slots).
  std::string check_against_cpu(Op op, std::int64_t tokens, const RotatingSets& sets) {
    const std::int64_t n = std::min(tokens, kCheckTokens);
    const Device cpu = Device::cpu();
    const std::vector<Role> roles = roles_of(op, tokens, config_);
    std::vector<std::int64_t> gpu_slots;
    if (uses_cache(op)) {
      const int slot_role = op == Op::kRopeCache    ? int(rope::kSlots)
                            : op == Op::kCacheWrite ? int(write::kSlots)
                                                    : int(gather::kSlots);
      gpu_slots = to_host<std::int64_t>(sets.at(slot_role, 0), n);
    }
    std::vector<std::vector<std::byte>> host = host_copies(op, tokens, n, sets, gpu_slots);
    std::vector<std::byte*> ptrs;
    for (std::vector<std::byte>& h : host) ptrs.push_back(h.data());
    const Views v = views_of(op, n, config_, ptrs.data(), cpu, pages_of(n, config_));
    const TensorView cos_sin(const_cast<float*>(host_cos_sin_.data()), DType::kF32,
                             {kMaxPositions, kMlaRopeDim}, cpu);
    run_op(op, v, cos_sin, TensorView());

    std::int64_t diff = 0, compared = 0;
    std::string where;
    auto compare = [&](const char* what, const std::vector<std::byte>& cpu_bytes,
                       const std::vector<std::byte>& gpu_bytes) {
      const std::int64_t d = count_diff(cpu_bytes, gpu_bytes);
      compared += std::int64_t(cpu_bytes.size());
      if (d != 0) where += concat(where.empty() ? "" : ", ", what, " ", d);
      diff += d;
    };
    auto tokens_of = [&](int role) {  // the GPU's first n tokens of an output role
      const std::int64_t per_token = roles[std::size_t(role)].bytes / tokens;
      return to_host<std::byte>(sets.at(role, 0), n * per_token);
    };
    auto cache_of = [&](int role) {  // the CPU's and the GPU's cache rows of the checked tokens
      compare("cache",
              std::vector<std::byte>(host[std::size_t(role)].begin(),
                                     host[std::size_t(role)].begin() + n * kLatent),
              cache_rows(sets.at(role, 0), gpu_slots));
    };
    switch (op) {
      case Op::kRope:
      case Op::kRopeCache:
        compare("q_out", host[rope::kQOut], tokens_of(rope::kQOut));
        compare("k_out", host[rope::kKOut], tokens_of(rope::kKOut));
        if (op == Op::kRopeCache) cache_of(rope::kCache);
        break;
      case Op::kCacheWrite:
        cache_of(write::kCache);
        break;
      case Op::kGather:
        compare("kv_c/k_pe", host[gather::kOut], tokens_of(gather::kOut));
        break;
      case Op::kPack:
        compare("k_out", host[pack::kKOut], tokens_of(pack::kKOut));
        compare("v_out", host[pack::kVOut], tokens_of(pack::kVOut));
        break;
    }
    if (diff == 0) return concat("ok (", n, " tokens bit-exact vs CPU)");
    return concat("MISMATCH vs CPU on ", n, " tokens: ", diff, "/", compared, " bytes (", where,
                  ")");
  }

  MemoryBench& bench_;
  const Config& config_;
  std::vector<float> host_cos_sin_;
  DeviceBuffer cos_sin_buffer_;
  DeviceBuffer flag_;
};

Config config_of(const Options& options) {
  Config config;
  config.heads = options.heads;
  config.page_size = options.page_size;
  if (options.style == "interleaved") {
    config.style = RopeStyle::kInterleaved;
  } else if (options.style == "neox") {
    config.style = RopeStyle::kNeox;
  } else {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("--style: expected interleaved or neox, got '", options.style, "'"));
  }
  if (config.heads < 1 || config.page_size < 1 || config.page_size > 128) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("--heads must be >= 1 and --page-size in 1..128, got ", config.heads,
                       " and ", config.page_size));
  }
  return config;
}

MemoryFamily family_of(const Options& options, const Config& config) {
  const std::string setup = concat("H=", config.heads, ", page size ", config.page_size, ", RoPE ",
                                   style_name(config.style), "; ");
  const char* timing = options.host_paced ? ", host-paced" : ", queued back to back";
  MemoryFamily family{"prep", 18, 16, /*label_width=*/0, /*sets_column=*/true, setup, timing, {}};
  family.run_fields
      .add("timer",
           json_string(options.host_paced
                           ? "CUDA events around each launch, default stream, median; launches "
                             "issued as the device runs them (host time included when a launch "
                             "is shorter than issuing it)"
                           : "CUDA events around each launch, default stream, median; all timed "
                             "launches queued behind a host gate, then run back to back (device "
                             "time)"))
      .add("queued", json_bool(!options.host_paced))
      .add("iters", options.iters)
      .add("warmup", options.warmup)
      .add("pdl", json_bool(!options.no_pdl))
      .add("heads", config.heads)
      .add("page_size", config.page_size)
      .add("rope_style", json_string(style_name(config.style)))
      .add("max_positions", kMaxPositions);
  return family;
}

void run_bench_prep(const Options& options) {
  check_timing_options(options);
  const Config config = config_of(options);
  std::vector<std::int64_t> tokens = options.tokens;
  if (tokens.empty()) tokens.assign(std::begin(kTokens), std::end(kTokens));
  for (std::int64_t t : tokens) {
    if (t < 1 || t > kMaxPositions) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("--tokens: expected values in 1..", kMaxPositions, ", got ", t));
    }
  }
  std::vector<std::pair<const OpInfo*, std::int64_t>> cases;
  for (std::size_t op : select_ops(options.ops, names_of(kOps))) {
    for (std::int64_t t : tokens) cases.emplace_back(&kOps[op], t);
  }
  start_device(options.no_pdl);
  MemoryBench bench(options, /*queued=*/!options.host_paced);
  PrepRunner runner(bench, config);
  run_memory_bench(
      family_of(options, config), bench, cases.size(),
      [&](std::size_t i) { return describe(*cases[i].first, cases[i].second, config); },
      [&](std::size_t i, MemoryResult& r) {
        runner.measure(cases[i].first->op, cases[i].second, r);
      });
}

}  // namespace

void add_bench_prep_command(CLI::App& bench) {
  add_memory_command(
      bench, "prep",
      "Time the MLA prep ops (RoPE + FP8 Q/K, latent cache write and gather, K/V pack) on cuda:0 "
      "(CUDA events, median, buffers rotated past 2x the L2) against a device copy of the same "
      "bytes",
      names_of(kOps), &run_bench_prep, [](CLI::App& cmd, Options& o) {
        cmd.add_option("--tokens", o.tokens,
                       "Token counts T, comma-separated (default 1,16,64,256,1024,4096,8192,"
                       "16384,65536,131072)")
            ->delimiter(',');
        cmd.add_option("--heads", o.heads, "Query heads H (128 / TP)")->capture_default_str();
        cmd.add_option("--page-size", o.page_size, "Latent cache page size (1..128)")
            ->capture_default_str();
        cmd.add_option("--style", o.style, "RoPE style of the rope ops: interleaved or neox")
            ->capture_default_str();
        cmd.add_flag("--host-paced", o.host_paced,
                     "Issue the timed launches while the device runs them, as `bench quant` "
                     "does (default: queue them all behind a host gate first, so each interval "
                     "is device time only)");
      });
}

}  // namespace fp8mla::cli
