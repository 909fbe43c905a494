// The MLA layer in fp8mla._C (fp8mla/mla_layer.hpp): MlaConfig (presets and Hugging Face
// config.json), the weights (generated, or loaded from a model directory) and MlaLayer with its
// prefill and the float64 reference. The Python class fp8mla.MlaLayer (python/fp8mla/_layer.py)
// allocates the outputs and the CUDA workspace; this file only converts.
//
// Lifetime: loaded weights are views into the model directory's mapped shards, so a Weights
// object holds the SafetensorsModel, and a Layer holds its Weights and its communicator
// (nb::keep_alive), which makes every order of deletion from Python safe.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fp8mla/attention_backend.hpp"
#include "fp8mla/mla_config.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "fp8mla/mla_weights.hpp"
#include "params.hpp"
#if defined(FP8MLA_PYTHON_WITH_MODEL)
#include "fp8mla/hf_model.hpp"
#include "fp8mla/safetensors.hpp"
#endif

namespace fp8mla_python {

using namespace nb::literals;
// The Python type of an fp8mla::MlaConfig. A type of this namespace, because nanobind's
// signature building calls an unqualified concat that argument-dependent lookup would otherwise
// resolve to fp8mla::concat for a type of namespace fp8mla (or derived from one).
struct MlaConfig {
  fp8mla::MlaConfig c;
};

MlaConfig wrap(fp8mla::MlaConfig c) {
  return {std::move(c)};
}

template <>
struct Names<fp8mla::WeightFormat> {
  static constexpr std::pair<std::string_view, fp8mla::WeightFormat> kAll[] = {
      {"bf16", fp8mla::WeightFormat::kBf16}, {"fp8", fp8mla::WeightFormat::kFp8Block}};
};

namespace {

// A layer's weights with what their views point into: generated ones own their bytes
// (MlaWeights::storage), loaded ones point into `model`'s open shards. `tp`: the rank's shard of
// the full weights of `config` (fp8mla/mla_parallel.hpp), or {0, 1} for the full weights.
struct Weights {
  MlaConfig config;
  fp8mla::MlaWeights weights;
  std::shared_ptr<const void> model;
  fp8mla::MlaTensorParallel tp;
};

// (prefix, extend, slots) per sequence, slots a list: a batch handed back to Python (a rank's
// share of a context-parallel batch, from_batch).
using PyBatch = std::vector<std::tuple<std::int64_t, std::int64_t, std::vector<std::int64_t>>>;
// A batch as the Python side hands it in: (prefix, extend, slots), the slots a contiguous int64
// host array, copied in one go (a list would be converted element by element: ~1 ms at 16k).
using PySlots = nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using PyBatchIn = std::vector<std::tuple<std::int64_t, std::int64_t, PySlots>>;

fp8mla::MlaBatch to_batch(const PyBatchIn& py) {
  fp8mla::MlaBatch batch;
  batch.sequences.reserve(py.size());
  for (const auto& [prefix, extend, slots] : py) {
    const std::int64_t* first = slots.data();
    batch.sequences.push_back({prefix, extend, {first, first + slots.shape(0)}});
  }
  return batch;
}

// (one_shot_max_prefix, chunk_capacity, cache_scale_inv, q_scale_inv, k_scale_inv, v_scale_inv,
// fuse_output_quant, fold_chunks, fp8_kv_from_projection)
using PyOptions =
    std::tuple<std::int64_t, std::int64_t, float, float, float, float, bool, bool, bool>;

fp8mla::MlaPrefillOptions to_options(const PyOptions& py) {
  fp8mla::MlaPrefillOptions o;
  std::tie(o.one_shot_max_prefix, o.chunk_capacity, o.cache_scale_inv, o.fp8.q_scale_inv,
           o.fp8.k_scale_inv, o.fp8.v_scale_inv, o.fuse_output_quant, o.fold_chunks,
           o.fp8_kv_from_projection) = py;
  return o;
}

[[noreturn]] void no_model_library(const char* what) {
  throw Error(ErrorCategory::kUnsupported,
              fp8mla::concat(what,
                             ": this build of fp8mla has no model-file support (it was "
                             "built without nlohmann_json)"));
}

// The YaRN parameters as make_cos_sin_cache's `yarn` dict, or None.
nb::object yarn_dict(const fp8mla::MlaConfig& c) {
  if (!c.rope.yarn) return nb::none();
  const fp8mla::YarnScaling& y = *c.rope.yarn;
  nb::dict d;
  d["factor"] = y.factor;
  d["original_max_position"] = y.original_max_position;
  d["beta_fast"] = y.beta_fast;
  d["beta_slow"] = y.beta_slow;
  d["mscale"] = y.mscale;
  d["mscale_all_dim"] = y.mscale_all_dim;
  return std::move(d);
}

MlaConfig config_from_json(const std::string& text, const std::string& source) {
#if defined(FP8MLA_PYTHON_WITH_MODEL)
  return wrap(fp8mla::mla_config_from_json(text, source));
#else
  (void)text, (void)source;
  no_model_library("MlaConfig.from_json");
#endif
}

MlaConfig config_from_file(const std::string& path) {
#if defined(FP8MLA_PYTHON_WITH_MODEL)
  return wrap(fp8mla::load_mla_config(path));
#else
  (void)path;
  no_model_library("MlaConfig.from_file");
#endif
}

void def_config(nb::module_& m) {
  nb::class_<MlaConfig>(m, "MlaConfig",
                        "One MLA attention layer's shapes (fp8mla/mla_config.hpp), read-only")
      .def_static(
          "preset", [](const std::string& name) { return wrap(fp8mla::mla_preset(name)); },
          "name"_a)
      .def_static("preset_names", &fp8mla::mla_preset_names)
      .def_static("from_json", &config_from_json, "text"_a, "source"_a = "config.json")
      .def_static("from_file", &config_from_file, "path"_a)
      .def_prop_ro("name", [](const MlaConfig& m) { return m.c.name; })
      .def_prop_ro("hidden", [](const MlaConfig& m) { return m.c.hidden; })
      .def_prop_ro("heads", [](const MlaConfig& m) { return m.c.heads; })
      .def_prop_ro("q_lora_rank", [](const MlaConfig& m) { return m.c.q_lora_rank; })
      .def_prop_ro("kv_lora_rank", [](const MlaConfig& m) { return m.c.kv_lora_rank; })
      .def_prop_ro("max_position", [](const MlaConfig& m) { return m.c.max_position; })
      .def_prop_ro("rms_norm_eps", [](const MlaConfig& m) { return m.c.rms_norm_eps; })
      .def_prop_ro("rope_theta", [](const MlaConfig& m) { return m.c.rope.theta; })
      .def_prop_ro("yarn", [](const MlaConfig& m) { return yarn_dict(m.c); })
      .def_prop_ro("softmax_scale", [](const MlaConfig& m) { return m.c.softmax_scale(); })
      .def("__repr__", [](const MlaConfig& m) {
        const fp8mla::MlaConfig& c = m.c;
        return fp8mla::concat("fp8mla.MlaConfig('", c.name, "', hidden=", c.hidden,
                              ", heads=", c.heads, ", q_lora_rank=", c.q_lora_rank, ")");
      });
}

Weights generate(const MlaConfig& config, fp8mla::WeightFormat format, std::uint64_t seed) {
  return {config, fp8mla::generate_mla_weights(config.c, format, seed), nullptr, {}};
}

// The shard keeps the full weights' bytes (MlaWeights::storage) and model alive.
Weights shard(const Weights& full, int rank, int size) {
  if (full.tp.size != 1) {
    throw Error(ErrorCategory::kInvalidArgument,
                fp8mla::concat("shard_mla_weights: expected full weights, got rank ", full.tp.rank,
                               " of ", full.tp.size, "'s shard"));
  }
  return {full.config,
          fp8mla::shard_mla_weights(full.weights, full.config.c, {rank, size}),
          full.model,
          {rank, size}};
}

Weights load(const std::string& model_dir, int layer, int rank, int size) {
#if defined(FP8MLA_PYTHON_WITH_MODEL)
  auto model = std::make_shared<const fp8mla::SafetensorsModel>(model_dir);
  return {wrap(model->config()),
          fp8mla::load_mla_weights(*model, layer, {rank, size}),
          model,
          {rank, size}};
#else
  (void)model_dir, (void)layer, (void)rank, (void)size;
  no_model_library("load_mla_weights");
#endif
}

void save(const Weights& w, const std::string& path, int layer) {
#if defined(FP8MLA_PYTHON_WITH_MODEL)
  const auto tensors = fp8mla::mla_weight_tensors(w.weights, w.config.c, layer);
  fp8mla::write_safetensors(path, tensors);
#else
  (void)w, (void)path, (void)layer;
  no_model_library("MlaWeights.save");
#endif
}

void def_weights(nb::module_& m) {
  nb::class_<Weights>(m, "MlaWeights",
                      "One MLA layer's weights and the memory they point into "
                      "(fp8mla/mla_weights.hpp)")
      .def_ro("config", &Weights::config)
      .def_prop_ro("format",
                   [](const Weights& w) {
                     return w.weights.format == fp8mla::WeightFormat::kBf16 ? "bf16" : "fp8";
                   })
      .def_prop_ro("tensor_parallel",
                   [](const Weights& w) { return std::make_tuple(w.tp.rank, w.tp.size); })
      .def("save", &save, "path"_a, "layer"_a = 0,
           "Writes the weights under layer `layer`'s tensor names to a safetensors file");
  m.def(
      "generate_mla_weights",
      [](const MlaConfig& config, const std::string& format, std::uint64_t seed) {
        Args args("generate_mla_weights");
        return generate(config, choice<fp8mla::WeightFormat>("format").convert(args, format), seed);
      },
      "config"_a, "format"_a, "seed"_a);
  m.def("load_mla_weights", &load, "model_dir"_a, "layer"_a, "rank"_a = 0, "size"_a = 1,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("shard_mla_weights", &shard, "weights"_a, "rank"_a, "size"_a);
}

// The layer; the Python object keeps the Weights it was made from, and its communicator (the
// C++ layer holds a raw pointer to it), alive (keep_alive).
struct Layer {
  Layer(const MlaConfig& config, const Weights& w, fp8mla::Device device,
        fp8mla::MlaCommunicator* communicator)
      : layer(config.c, w.weights, device, w.tp, communicator) {}
  fp8mla::MlaLayer layer;
};

// (max_tokens, max_sequences, max_prefix_tokens, max_gathered_rows)
using PyLimits = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>;

std::size_t workspace_bytes(const Layer& self, const PyLimits& limits, const PyOptions& options,
                            const std::string& backend) {
  const auto [max_tokens, max_sequences, max_prefix_tokens, max_gathered_rows] = limits;
  return self.layer.workspace_bytes(
      {max_tokens, max_sequences, max_prefix_tokens, max_gathered_rows}, to_options(options),
      backend_named(backend));
}

// (mode, note): "fused", "separate" or "none", and the line saying why.
std::tuple<std::string, std::string> output_quant_plan(const Layer& self, const PyOptions& options,
                                                       const std::string& backend) {
  const fp8mla::MlaOutputQuantPlan plan =
      self.layer.output_quant_plan(backend_named(backend), to_options(options));
  return {std::string(fp8mla::to_string(plan.mode)), plan.note};
}

// What every prefill binding takes alike: the cache, out, the workspace (None: none), the options
// and the backend.
struct PrefillArgs {
  TensorView cache, out, workspace;
  fp8mla::MlaPrefillOptions options;
  const fp8mla::AttentionBackend* backend;
  PrefillArgs(Args& args, nb::handle cache_, nb::handle out_, nb::handle workspace_,
              const PyOptions& options_, const std::string& backend_)
      : cache(args.output(cache_, "cache")),
        out(args.output(out_, "out")),
        workspace(workspace_.is_none() ? TensorView() : args.output(workspace_, "workspace")),
        options(to_options(options_)),
        backend(&backend_named(backend_)) {}
};

void prefill(Layer& self, nb::handle hidden, const PyBatchIn& batch, nb::handle cache,
             const std::string& backend, const PyOptions& options, nb::handle out,
             nb::handle workspace, std::uintptr_t stream) {
  Args args("MlaLayer.prefill");
  const TensorView hidden_view = args.input(hidden, "hidden");
  const PrefillArgs p(args, cache, out, workspace, options, backend);
  const fp8mla::MlaBatch b = to_batch(batch);
  nb::gil_scoped_release release;
  self.layer.prefill(hidden_view, b, p.cache, *p.backend, p.options, p.out, p.workspace, nullptr,
                     to_stream(stream));
}

// prefill of a batch described by tensors on the layer's device (fp8mla::MlaDeviceBatch): the
// row count is hidden's, as MlaLayer::prefill checks it against out's.
void prefill_device_batch(Layer& self, nb::handle hidden, nb::handle cu_seqlens_q,
                          nb::handle positions, nb::handle slot_mapping, std::int32_t max_seqlen_q,
                          nb::handle cu_seqlens_prefix, nb::handle prefix_slots,
                          std::int32_t max_seqlen_prefix, nb::handle cache,
                          const std::string& backend, const PyOptions& options, nb::handle out,
                          nb::handle workspace, std::uintptr_t stream) {
  Args args("MlaLayer.prefill_device_batch");
  const TensorView hidden_view = args.input(hidden, "hidden");
  fp8mla::MlaDeviceBatch b;
  b.cu_seqlens_q = args.input(cu_seqlens_q, "cu_seqlens_q");
  b.positions = args.input(positions, "positions");
  b.slot_mapping = args.input(slot_mapping, "slot_mapping");
  b.tokens = hidden_view.ndim() >= 1 ? hidden_view.size(0) : 0;
  b.max_seqlen_q = max_seqlen_q;
  if (!cu_seqlens_prefix.is_none()) {
    b.cu_seqlens_prefix = args.input(cu_seqlens_prefix, "cu_seqlens_prefix");
    b.prefix_slots = args.input(prefix_slots, "prefix_slots");
    b.prefix_tokens = b.prefix_slots.ndim() >= 1 ? b.prefix_slots.size(0) : 0;
    b.max_seqlen_prefix = max_seqlen_prefix;
  }
  const PrefillArgs p(args, cache, out, workspace, options, backend);
  nb::gil_scoped_release release;
  self.layer.prefill(hidden_view, b, p.cache, *p.backend, p.options, p.out, p.workspace, nullptr,
                     to_stream(stream));
}

// Rank `rank` of `size`'s share of a batch (fp8mla::mla_context_parallel_batch), kept whole for
// prefill_context_parallel; its fields are read-only properties.
struct ContextParallelBatch {
  fp8mla::MlaContextParallelBatch b;
};

PyBatch from_batch(const fp8mla::MlaBatch& batch) {
  PyBatch py;
  for (const fp8mla::MlaSequence& s : batch.sequences) py.emplace_back(s.prefix, s.extend, s.slots);
  return py;
}

PyLimits limits_of(const ContextParallelBatch& cp) {
  const fp8mla::MlaWorkspaceLimits l = cp.b.workspace_limits();
  return {l.max_tokens, l.max_sequences, l.max_prefix_tokens, l.max_gathered_rows};
}

void prefill_context_parallel(Layer& self, nb::handle hidden, const ContextParallelBatch& batch,
                              Communicator& communicator, nb::handle cache,
                              const std::string& backend, const PyOptions& options, nb::handle out,
                              nb::handle workspace, std::uintptr_t stream) {
  Args args("MlaLayer.prefill_context_parallel");
  const TensorView hidden_view = args.input(hidden, "hidden");
  const PrefillArgs p(args, cache, out, workspace, options, backend);
  nb::gil_scoped_release release;  // the all-gather waits for the other ranks
  self.layer.prefill_context_parallel(hidden_view, batch.b, *communicator.c, p.cache, *p.backend,
                                      p.options, p.out, p.workspace, nullptr, to_stream(stream));
}

// (amax q, k, v, cache, headroom, q_scale_inv, k_scale_inv, v_scale_inv, cache_scale_inv)
using PyCalibration = std::tuple<float, float, float, float, float, float, float, float, float>;

PyCalibration calibrate(Layer& self, nb::handle hidden, const PyBatchIn& batch, float headroom,
                        std::uintptr_t stream) {
  Args args("MlaLayer.calibrate");
  const TensorView hidden_view = args.input(hidden, "hidden");
  const fp8mla::MlaBatch b = to_batch(batch);
  fp8mla::MlaCalibration c;
  {
    nb::gil_scoped_release release;
    c = self.layer.calibrate(hidden_view, b, {headroom}, to_stream(stream));
  }
  return {c.amax.q,          c.amax.k,          c.amax.v,          c.amax.cache,     c.headroom,
          c.fp8.q_scale_inv, c.fp8.k_scale_inv, c.fp8.v_scale_inv, c.cache_scale_inv};
}

// The float64 reference on CPU inputs: a new f64 numpy array [T, hidden].
nb::object reference(const Weights& w, nb::handle hidden, const PyBatchIn& batch, nb::handle cache,
                     float cache_scale_inv) {
  Args args("mla_prefill_reference");
  if (w.tp.size != 1) {  // the reference is the full layer's: a shard would be read as one
    throw Error(ErrorCategory::kInvalidArgument,
                "mla_prefill_reference: expected full weights, got a tensor-parallel shard");
  }
  const TensorView hidden_view = args.input(hidden, "hidden");
  const TensorView cache_view = args.input(cache, "cache");
  const fp8mla::MlaBatch b = to_batch(batch);
  const std::int64_t tokens = hidden_view.ndim() == 2 ? hidden_view.size(0) : 0;
  auto* out = new std::vector<double>(static_cast<std::size_t>(tokens * w.config.c.hidden));
  nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
  {
    nb::gil_scoped_release release;
    fp8mla::mla_prefill_reference(w.config.c, w.weights, hidden_view, b, cache_view,
                                  cache_scale_inv, out->data());
  }
  const std::size_t shape[2] = {static_cast<std::size_t>(tokens),
                                static_cast<std::size_t>(w.config.c.hidden)};
  return nb::cast(nb::ndarray<nb::numpy, double, nb::ndim<2>>(out->data(), 2, shape, owner));
}

void def_layer(nb::module_& m) {
  nb::class_<Layer>(m, "MlaLayer")
      .def(
          "__init__",
          [](Layer* self, const MlaConfig& config, const Weights& w, const std::string& device_type,
             int device_index, Communicator* communicator) {
            Args args("MlaLayer");
            const fp8mla::Device device{
                choice<fp8mla::DeviceType>("device").convert(args, device_type), device_index};
            nb::gil_scoped_release release;
            new (self) Layer(config, w, device, communicator ? communicator->c.get() : nullptr);
          },
          "config"_a, "weights"_a, "device_type"_a, "device_index"_a,
          "communicator"_a.none() = nb::none(), nb::keep_alive<1, 3>(), nb::keep_alive<1, 6>())
      .def_prop_ro("projection_notes",
                   [](const Layer& self) { return self.layer.projection_notes(); })
      .def("workspace_bytes", &workspace_bytes, "limits"_a, "options"_a, "backend"_a)
      .def("output_quant_plan", &output_quant_plan, "options"_a, "backend"_a)
      .def("prefill", &prefill, "hidden"_a, "batch"_a, "cache"_a, "backend"_a, "options"_a, "out"_a,
           "workspace"_a.none(), "stream"_a = 0)
      .def("prefill_device_batch", &prefill_device_batch, "hidden"_a, "cu_seqlens_q"_a,
           "positions"_a, "slot_mapping"_a, "max_seqlen_q"_a, "cu_seqlens_prefix"_a.none(),
           "prefix_slots"_a.none(), "max_seqlen_prefix"_a, "cache"_a, "backend"_a, "options"_a,
           "out"_a, "workspace"_a.none(), "stream"_a = 0)
      .def("prefill_context_parallel", &prefill_context_parallel, "hidden"_a, "batch"_a,
           "communicator"_a, "cache"_a, "backend"_a, "options"_a, "out"_a, "workspace"_a.none(),
           "stream"_a = 0)
      .def("calibrate", &calibrate, "hidden"_a, "batch"_a, "headroom"_a, "stream"_a = 0);
  nb::class_<ContextParallelBatch>(m, "MlaContextParallelBatch",
                                   "One rank's share of a context-parallel batch "
                                   "(fp8mla/mla_layer.hpp)")
      .def_prop_ro("rank", [](const ContextParallelBatch& cp) { return cp.b.cp.rank; })
      .def_prop_ro("size", [](const ContextParallelBatch& cp) { return cp.b.cp.size; })
      .def_prop_ro("batch", [](const ContextParallelBatch& cp) { return from_batch(cp.b.batch); })
      .def_prop_ro("tokens", [](const ContextParallelBatch& cp) { return cp.b.tokens; })
      .def_prop_ro("rows_per_rank",
                   [](const ContextParallelBatch& cp) { return cp.b.rows_per_rank; })
      .def_prop_ro("gathered_slots",
                   [](const ContextParallelBatch& cp) { return cp.b.gathered_slots; })
      .def_prop_ro("workspace_limits", &limits_of);
  m.def(
      "mla_context_parallel_batch",
      [](const PyBatchIn& batch, int rank, int size) {
        return ContextParallelBatch{
            fp8mla::mla_context_parallel_batch(to_batch(batch), {rank, size})};
      },
      "batch"_a, "rank"_a, "size"_a);
  m.attr("MLA_CALIBRATION_HEADROOM") = fp8mla::kMlaCalibrationHeadroom;
  m.def("mla_prefill_reference", &reference, "weights"_a, "hidden"_a, "batch"_a, "cache"_a,
        "cache_scale_inv"_a = 1.0f);
}

}  // namespace

void def_layer_bindings(nb::module_& m) {
  def_config(m);
  def_weights(m);
  def_layer(m);
}

}  // namespace fp8mla_python
