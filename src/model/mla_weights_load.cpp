// load_mla_weights (fp8mla/mla_weights.hpp): a layer's weights as views into a safetensors file,
// or into several (a sharded checkpoint), checked against the config. In fp8mla::model, with the
// safetensors reader it needs.
#include <algorithm>
#include <string>
#include <vector>

#include "fp8mla/error.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "fp8mla/mla_weights.hpp"
#include "model/mla_weight_specs.hpp"

namespace fp8mla {
namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += concat(i ? ", " : "", shape[i]);
  return s + "]";
}

const SafetensorsTensor& expect(const TensorFileLookup& file_of, const std::string& name,
                                std::initializer_list<DType> dtypes,
                                const std::vector<std::int64_t>& shape) {
  const SafetensorsFile& file = file_of(name);
  const SafetensorsTensor& t = file.at(name);
  const bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), t.dtype) != dtypes.end();
  std::string wanted;
  for (DType d : dtypes) wanted += concat(wanted.empty() ? "" : " or ", dtype_name(d));
  if (!dtype_ok || t.shape != shape) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("'", file.path(), "': tensor '", name, "': expected ", wanted, " ",
                       shape_text(shape), ", got ", dtype_name(t.dtype), " ", shape_text(t.shape)));
  }
  return t;
}

// Every tensor of the layer as the file holds it (the full checkpoint).
MlaWeights load_full_mla_weights(const TensorFileLookup& file_of, const MlaConfig& config,
                                 int layer) {
  MlaWeights w;
  bool first = true;
  for (const model::ProjectionSpec& p : model::projections(config)) {
    const std::string name = mla_tensor_name(layer, concat(p.name, ".weight"));
    const SafetensorsTensor& t = expect(file_of, name, {DType::kBF16, DType::kE4M3}, {p.out, p.in});
    const WeightFormat format =
        t.dtype == DType::kE4M3 ? WeightFormat::kFp8Block : WeightFormat::kBf16;
    if (first) w.format = format;
    if (format != w.format) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("'", file_of(name).path(), "': tensor '", name, "' is ",
                         dtype_name(t.dtype), " while the layer's first projection is ",
                         w.format == WeightFormat::kBf16 ? "bf16" : "e4m3",
                         "; expected one format for every projection"));
    }
    first = false;
    MlaProjection& proj = w.*(p.member);
    proj.weight = t.view();
    if (format == WeightFormat::kFp8Block) {
      proj.scale_inv =
          expect(file_of, mla_tensor_name(layer, concat(p.name, ".weight_scale_inv")),
                 {DType::kF32}, {model::weight_blocks(p.out), model::weight_blocks(p.in)})
              .view();
    }
  }
  for (const model::NormSpec& n : model::norms(config)) {
    w.*(n.member) =
        expect(file_of, mla_tensor_name(layer, concat(n.name, ".weight")), {DType::kBF16}, {n.size})
            .view();
  }
  return w;
}

}  // namespace

MlaWeights load_mla_weights(const SafetensorsFile& file, const MlaConfig& config, int layer,
                            MlaTensorParallel tp) {
  return load_mla_weights([&](const std::string&) -> const SafetensorsFile& { return file; },
                          config, layer, tp);
}

MlaWeights load_mla_weights(const TensorFileLookup& file_of, const MlaConfig& config, int layer,
                            MlaTensorParallel tp) {
  MlaWeights full = load_full_mla_weights(file_of, config, layer);
  if (tp.size == 1 && tp.rank == 0) return full;
  return shard_mla_weights(full, config, tp);
}

}  // namespace fp8mla
