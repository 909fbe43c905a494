// The bad inputs of the attention backends (fp8mla/attention_backend.hpp) and of the MLA layer
// (fp8mla/mla_layer.hpp, mla_config.hpp, mla_weights.hpp, mla_parallel.hpp): unknown names,
// requirements a backend lacks, hook arguments, batches (host and device), options, configs,
// weights, the context-parallel split and the communicators.
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "bad_inputs_catalogue.hpp"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/mla_parallel.hpp"

namespace fp8mla::test {
namespace {

constexpr auto kInvalid = ErrorCategory::kInvalidArgument;
constexpr auto kUnsupported = ErrorCategory::kUnsupported;
constexpr std::int64_t kT = 2, kH = 2;
static_assert(kT == 2 && kH == 2, "rope_args (bad_inputs_catalogue.hpp) is 2 tokens of 2 heads");

void check(std::string_view backend, BackendRequirements required) {
  check_backend(make_attention_backend(backend)->capabilities(), required, Device::cpu());
}

// The hook's arguments for 2 tokens and 2 heads with the cache write, edited by `edit`, run on
// `backend`.
template <typename Edit>
auto prepare_call(std::string_view backend, Edit edit) {
  return [=](Arena& a) {
    PrepareQkvArgs p;
    p.qk = rope_args(a, /*cache=*/true);
    p.v = a.input(DType::kBF16, {kT, kH, 128});
    p.v_out = a.output(DType::kE4M3, {kT, kH, 128});
    edit(a, p);
    make_attention_backend(backend)->prepare_prefill_qkv(p);
  };
}

std::vector<BadInput> backend_bad_inputs() {
  return {
      {"make_attention_backend: unknown name",
       [](Arena&) { make_attention_backend("tpu"); },
       kInvalid,
       {"unknown attention backend 'tpu'", "known: cpu, cpu-bf16, fp8-hopper, bf16-hopper"}},
      {"check_backend: e4m3 attention of cpu-bf16",
       [](Arena&) { check("cpu-bf16", {.attention_dtype = DType::kE4M3}); },
       kUnsupported,
       {"Required: attention dtype e4m3fn", "Supported: attention dtypes bf16",
        "Missing: attention dtype e4m3fn"}},
      {"check_backend: head dims 96/128",
       [](Arena&) { check("cpu", {.head_dim_qk = 96}); },
       kUnsupported,
       {"head dims 96/128", "Supported: attention dtypes e4m3fn, bf16, head dims 192/128",
        "Missing: head dims 96/128"}},
      {"check_backend: page size 256",
       [](Arena&) { check("cpu", {.page_size = 256}); },
       kUnsupported,
       {"page size 256", "page sizes 1-128", "Missing: page size 256"}},
      {"check_backend: fp8-hopper on the CPU",
       [](Arena&) { check("fp8-hopper", {}); },
       kUnsupported,
       {"attention backend 'fp8-hopper' cannot serve this layer on cpu", "architecture cpu",
        "Missing:"}},
      {"check_backend: the hook of cpu-bf16",
       [](Arena&) {
         check("cpu-bf16", {.attention_dtype = DType::kBF16, .prepare_prefill_qkv = true});
       },
       kUnsupported,
       {"Required: attention dtype bf16", "prepare_prefill_qkv no",
        "Missing: prepare_prefill_qkv"}},
      {"prepare_prefill_qkv: cpu-bf16 has no hook",
       prepare_call("cpu-bf16", [](Arena&, auto&) {}),
       kUnsupported,
       {"attention backend 'cpu-bf16' has no prepare_prefill_qkv"}},
      {"prepare_prefill_qkv: v of 3 tokens for 2",
       prepare_call("cpu",
                    [](Arena& a, auto& p) {
                      p.v = a.input(DType::kBF16, {3, kH, 128});
                      p.v_out = a.output(DType::kE4M3, {3, kH, 128});
                    }),
       kInvalid,
       {"`v`: expected the 2 tokens and 2 heads of `q_nope`", "got bf16[3, 2, 128]"}},
      {"prepare_prefill_qkv: bf16 v_out (rejected before Q and K are written)",
       prepare_call("cpu",
                    [](Arena& a, auto& p) {
                      p.v_out = a.output(DType::kBF16, {kT, kH, 128});
                    }),
       kInvalid,
       {"mla_v_quantize_fp8: `v_out` dtype", "expected e4m3fn", "got bf16"}},
      {"prepare_prefill_qkv: v without v_out (rejected before Q and K are written)",
       prepare_call("cpu", [](Arena&, auto& p) { p.v_out = TensorView(); }),
       kInvalid,
       {"mla_v_quantize_fp8: `v_out`"}},
      {"prepare_prefill_qkv: v_out without v (rejected before Q and K are written)",
       prepare_call("cpu", [](Arena&, auto& p) { p.v = TensorView(); }),
       kInvalid,
       {"mla_v_quantize_fp8: `v`"}},
      {"prepare_prefill_qkv: NaN v_scale_inv",
       prepare_call(
           "cpu", [](Arena&, auto& p) { p.v_scale_inv = std::numeric_limits<float>::quiet_NaN(); }),
       kInvalid,
       {"`v_scale_inv`: expected a finite scale > 0", "got nan"}},
      {"prepare_prefill_qkv: slot past the cache",
       prepare_call("cpu",
                    [](Arena& a, auto& p) {
                      p.qk.cache_write->slot_mapping = a.ints(DType::kI32, {0, 99});
                    }),
       ErrorCategory::kOutOfRange,
       {"`slot_mapping`[1] = 99", "outside the cache's [0, 8) slots"}},
      {"pack_prefix_chunk_kv: cpu-bf16 has no pack",
       [](Arena&) { make_attention_backend("cpu-bf16")->pack_prefix_chunk_kv({}); },
       kUnsupported,
       {"attention backend 'cpu-bf16' has no pack_prefix_chunk_kv"}},
      {"pack_prefix_chunk_kv: transposed V from the token-major cpu backend",
       [](Arena& a) {
         MlaKvPackArgs p = pack_args(a, kT, kH);
         p.v_layout = VLayout::kTransposed;
         make_attention_backend("cpu")->pack_prefix_chunk_kv(p);
       },
       kInvalid,
       {"attention backend 'cpu' packs V token-major", "ask for the other layout"}},
      {"AttentionBackend::prefill_attention: Dqk 96 through the cpu backend",
       [](Arena& a) {
         PrefillAttentionArgs p;
         p.q = a.input(DType::kBF16, {kT, kH, 96});
         p.k = a.input(DType::kBF16, {kT, kH, 96});
         p.v = a.input(DType::kBF16, {kT, kH, 128});
         p.cu_seqlens_q = p.cu_seqlens_k = a.ints(DType::kI32, {0, kT});
         p.max_seqlen_q = p.max_seqlen_k = int(kT);
         p.softmax_scale = 0.1f;
         p.out = a.output(DType::kBF16, {kT, kH, 128});
         make_attention_backend("cpu")->prefill_attention(p);
       },
       kUnsupported,
       {"`q`: expected a head dim of 192, 128 or 64", "got bf16[2, 2, 96]"}},
  };
}

// The tiny preset's layer with bf16 weights, made once (its weights outlive the catalogue).
struct TinyLayer {
  MlaConfig config = mla_preset("tiny");
  MlaWeights weights = generate_mla_weights(config, WeightFormat::kBf16, 5);
  MlaLayer layer{config, weights};
};

TinyLayer& tiny() {
  static TinyLayer t;
  return t;
}

// A prefill of one sequence of 3 new tokens on 4 pages of 16 slots with the cpu backend, its
// arguments edited by `edit`.
template <typename Edit>
auto prefill_call(Edit edit) {
  return [=](Arena& a) {
    const std::int64_t hidden = tiny().config.hidden;
    MlaBatch batch{{MlaSequence{0, 3, {4, 5, 6}}}};
    TensorView in = a.input(DType::kBF16, {3, hidden});
    TensorView cache = a.input(DType::kE4M3, {4, 16, 576});
    TensorView out = a.output(DType::kBF16, {3, hidden});
    MlaPrefillOptions options;
    std::string backend = "cpu";
    edit(a, in, batch, cache, options, out, backend);
    tiny().layer.prefill(in, batch, cache, *make_attention_backend(backend), options, out);
  };
}

std::vector<BadInput> layer_prefill_bad_inputs() {
  return {
      {"MlaLayer::prefill: hidden of 2 tokens for 3",
       prefill_call([](Arena& a, auto& in, auto&, auto&, auto&, auto&, auto&) {
         in = a.input(DType::kBF16, {2, 512});
       }),
       kInvalid,
       {"expected `hidden` contiguous bf16 [3, 512]", "got bf16[2, 512]"}},
      {"MlaLayer::prefill: f32 out",
       prefill_call([](Arena& a, auto&, auto&, auto&, auto&, auto& out, auto&) {
         out = a.output(DType::kF32, {3, 512});
       }),
       kInvalid,
       {"expected `out` contiguous bf16 [3, 512]", "got f32[3, 512]"}},
      {"MlaLayer::prefill: bf16 cache",
       prefill_call([](Arena& a, auto&, auto&, auto& cache, auto&, auto&, auto&) {
         cache = a.input(DType::kBF16, {4, 16, 576});
       }),
       kInvalid,
       {"expected `cache` e4m3 [pages, page_size, 576]", "got bf16[4, 16, 576]"}},
      {"MlaLayer::prefill: out on cuda:0",
       prefill_call([](Arena& a, auto&, auto&, auto&, auto&, auto& out, auto&) {
         out = a.output(DType::kBF16, {3, 512}, {.device = Device::cuda(0)});
       }),
       kInvalid,
       {"expected `out` on the layer's device cpu", "on cuda:0"}},
      {"MlaLayer::prefill: fewer slots than tokens",
       prefill_call([](Arena&, auto&, auto& batch, auto&, auto&, auto&, auto&) {
         batch.sequences[0].slots.pop_back();
       }),
       kInvalid,
       {"sequence 0: expected prefix, extend >= 0, prefix + extend <= 4096 and that many slots",
        "got prefix 0, extend 3, 2 slots"}},
      {"MlaLayer::prefill: positions past max_position",
       prefill_call([](Arena&, auto&, auto& batch, auto&, auto&, auto&, auto&) {
         batch.sequences[0].prefix = 4094;
         batch.sequences[0].slots.insert(batch.sequences[0].slots.begin(), 4094, 0);
       }),
       kInvalid,
       {"prefix + extend <= 4096", "got prefix 4094, extend 3"}},
      {"MlaLayer::prefill: slot past the cache",
       prefill_call([](Arena&, auto&, auto& batch, auto&, auto&, auto&, auto&) {
         batch.sequences[0].slots[2] = 64;
       }),
       ErrorCategory::kOutOfRange,
       {"`slot_mapping`[2] = 64", "outside the cache's [0, 64) slots"}},
      {"MlaLayer::prefill: chunk capacity 0",
       prefill_call([](Arena&, auto&, auto&, auto&, auto& options, auto&, auto&) {
         options.chunk_capacity = 0;
       }),
       kInvalid,
       {"expected options one_shot_max_prefix >= 0, chunk_capacity >= 1 and scales > 0",
        "got 8192, 0"}},
      {"MlaLayer::prefill: NaN cache scale",
       prefill_call([](Arena&, auto&, auto&, auto&, auto& options, auto&, auto&) {
         options.cache_scale_inv = std::numeric_limits<float>::quiet_NaN();
       }),
       kInvalid,
       {"scales > 0", "cache_scale_inv nan"}},
      {"MlaLayer::prefill: negative q scale",
       prefill_call([](Arena&, auto&, auto&, auto&, auto& options, auto&, auto&) {
         options.fp8.q_scale_inv = -1.0f;
       }),
       kInvalid,
       {"scales > 0", "fp8 scale_inv q/k/v -1/1/1"}},
      {"MlaLayer::prefill: page size 256 for the cpu backend",
       prefill_call([](Arena& a, auto&, auto& batch, auto& cache, auto&, auto&, auto&) {
         cache = a.input(DType::kE4M3, {1, 256, 576});
         batch.sequences[0].slots = {0, 1, 2};
       }),
       kUnsupported,
       {"attention backend 'cpu' cannot serve this layer on cpu", "Missing: page size 256"}},
      {"MlaLayer::prefill: fp8-hopper backend on the CPU",
       prefill_call([](Arena&, auto&, auto&, auto&, auto&, auto&, auto& backend) {
         backend = "fp8-hopper";
       }),
       kUnsupported,
       {"attention backend 'fp8-hopper' cannot serve this layer on cpu", "architecture cpu"}},
  };
}

std::vector<BadInput> layer_setup_bad_inputs() {
  return {
      {"mla_preset: unknown name",
       [](Arena&) { mla_preset("gpt"); },
       kInvalid,
       {"unknown MLA preset 'gpt'", "known: deepseek-v2-lite, deepseek-v2, deepseek-v3, tiny"}},
      {"MlaLayer: config of 0 heads",
       [](Arena&) {
         MlaConfig config = tiny().config;
         config.heads = 0;
         MlaLayer layer(config, tiny().weights);
       },
       kInvalid,
       {"MlaLayer: config 'tiny': expected hidden, heads, max_position >= 1", "heads 0"}},
      {"MlaLayer: kv_lora_rank 256",
       [](Arena&) {
         MlaConfig config = tiny().config;
         config.kv_lora_rank = 256;
         MlaLayer layer(config, tiny().weights);
       },
       kInvalid,
       {"kv_lora_rank 512", "kv_lora_rank 256"}},
      {"MlaLayer: weights of another head count",
       [](Arena&) {
         MlaConfig config = tiny().config;
         config.heads = 8;
         MlaLayer layer(config, tiny().weights);
       },
       kInvalid,
       {"weight 'q_b_proj.weight': expected contiguous bf16 [1536, 512]", "got bf16[768, 512]"}},
      {"MlaLayer: no weights",
       [](Arena&) { MlaLayer layer(tiny().config, MlaWeights{}); },
       kInvalid,
       {"weight 'q_a_proj.weight': expected contiguous bf16 [512, 512]", "got no data"}},
      {"MlaLayer: e4m3 weights without block scales",
       [](Arena&) {
         MlaWeights w = generate_mla_weights(tiny().config, WeightFormat::kFp8Block, 1);
         w.kv_b_proj.scale_inv = {};
         MlaLayer layer(tiny().config, w);
       },
       kInvalid,
       {"weight 'kv_b_proj.weight_scale_inv': expected contiguous f32 [8, 4]", "got no data"}},
      {"MlaLayer::calibrate: headroom below 1",
       [](Arena& a) {
         MlaBatch batch{{MlaSequence{0, 1, {0}}}};
         tiny().layer.calibrate(a.input(DType::kBF16, {1, 512}), batch, {.headroom = 0.5f});
       },
       kInvalid,
       {"MlaLayer::calibrate: expected a finite headroom >= 1", "got 0.5"}},
      {"MlaLayer::calibrate: no extend token",
       [](Arena& a) {
         MlaBatch batch{{MlaSequence{0, 0, {}}}};
         tiny().layer.calibrate(a.input(DType::kBF16, {0, 512}), batch);
       },
       kInvalid,
       {"expected a sample batch with at least one extend token", "got 0"}},
      {"mla_scale_inv_from_amax: infinite amax",
       [](Arena&) { mla_scale_inv_from_amax(std::numeric_limits<float>::infinity(), 2.0f, "q"); },
       kInvalid,
       {"expected a finite amax >= 0 of q", "got inf"}},
      {"MlaLayer::workspace_bytes: negative limits",
       [](Arena&) {
         tiny().layer.workspace_bytes({.max_tokens = -1}, {}, *make_attention_backend("cpu"));
       },
       kInvalid,
       {"expected limits >= 0", "got max_tokens -1"}},
  };
}

// A prefill of a device-described batch (host memory on the CPU): one sequence of 3 new tokens,
// padded to 4 rows, its views edited by `edit`.
template <typename Edit>
auto device_batch_call(Edit edit) {
  return [=](Arena& a) {
    const std::int64_t hidden = tiny().config.hidden;
    MlaDeviceBatch b{a.ints(DType::kI32, {0, 3}), a.ints(DType::kI64, {0, 1, 2, 0}),
                     a.ints(DType::kI64, {4, 5, 6, -1}), 4, 3};
    edit(a, b);
    tiny().layer.prefill(a.input(DType::kBF16, {4, hidden}), b, a.input(DType::kE4M3, {4, 16, 576}),
                         *make_attention_backend("cpu"), {}, a.output(DType::kBF16, {4, hidden}));
  };
}

std::vector<BadInput> parallel_bad_inputs() {
  const MlaBatch batch{{MlaSequence{0, 8, {0, 1, 2, 3, 4, 5, 6, 7}}}};
  return {
      {"MlaLayer::prefill (device batch): cu_seqlens_q from 1",
       device_batch_call([](Arena& a, MlaDeviceBatch& b) {
         b.cu_seqlens_q = a.ints(DType::kI32, {1, 3});
       }),
       kInvalid,
       {"expected cu_seqlens_q from 0 to at most tokens 4", "got 1 to 3"}},
      {"MlaLayer::prefill (device batch): int32 positions",
       device_batch_call([](Arena& a, MlaDeviceBatch& b) {
         b.positions = a.ints(DType::kI32, {0, 1, 2, 0});
       }),
       kInvalid,
       {"expected `positions` contiguous i64 [4]", "got i32[4]"}},
      {"MlaLayer::prefill (device batch): prefix slots shorter than prefix_tokens",
       device_batch_call([](Arena& a, MlaDeviceBatch& b) {
         b.cu_seqlens_prefix = a.ints(DType::kI32, {0, 2});
         b.prefix_slots = a.ints(DType::kI64, {8});
         b.prefix_tokens = 2;
         b.max_seqlen_prefix = 2;
       }),
       kInvalid,
       {"expected `prefix_slots` contiguous i64 [2]", "got i64[1]"}},
      {"mla_context_parallel_batch: rank 2 of 2",
       [batch](Arena&) {
         mla_context_parallel_batch(batch, {2, 2});
       },
       kInvalid,
       {"expected size >= 1 and 0 <= rank < size", "got rank 2 of 2"}},
      {"MlaLayer::prefill_context_parallel: a communicator of another size",
       [batch](Arena& a) {
         const MlaContextParallelBatch share = mla_context_parallel_batch(batch, {0, 2});
         const std::vector<std::unique_ptr<MlaCommunicator>> one = make_cpu_communicators(1);
         const std::int64_t hidden = tiny().config.hidden;
         tiny().layer.prefill_context_parallel(a.input(DType::kBF16, {4, hidden}), share, *one[0],
                                               a.input(DType::kE4M3, {4, 16, 576}),
                                               *make_attention_backend("cpu"), {},
                                               a.output(DType::kBF16, {4, hidden}));
       },
       kInvalid,
       {"the communicator is rank 0 of 1", "expected the batch's rank 0 of 2"}},
      {"MlaCommunicator::all_gather (cpu): out of the wrong rows",
       [](Arena& a) {
         const std::vector<std::unique_ptr<MlaCommunicator>> one = make_cpu_communicators(1);
         one[0]->all_gather(a.input(DType::kE4M3, {3, 576}), a.output(DType::kE4M3, {4, 576}),
                            nullptr);
       },
       kInvalid,
       {"all_gather", "e4m3fn[4, 576]"}},
  };
}

}  // namespace

std::vector<BadInput> model_bad_inputs() {
  std::vector<BadInput> all = backend_bad_inputs();
  for (auto part : {layer_prefill_bad_inputs(), layer_setup_bad_inputs(), parallel_bad_inputs()}) {
    all.insert(all.end(), part.begin(), part.end());
  }
#if !defined(FP8MLA_WITH_CUDA)
  all.push_back({"MlaLayer: a CUDA layer in a build without CUDA",
                 [](Arena&) { MlaLayer layer(tiny().config, tiny().weights, Device::cuda(0)); },
                 kUnsupported,
                 {"this build has no CUDA", "cannot run the layer on cuda:0"}});
#endif
  return all;
}

std::vector<ValidCall> model_valid_calls() {
  constexpr auto no_edit = [](Arena&, auto&) {};
  constexpr auto no_layer_edit = [](Arena&, auto&, auto&, auto&, auto&, auto&, auto&) {};
  return {{"prepare_prefill_qkv of cpu", prepare_call("cpu", no_edit)},
          {"MlaLayer::prefill", prefill_call(no_layer_edit)}};
}

}  // namespace fp8mla::test
