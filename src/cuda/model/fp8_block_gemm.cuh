// The CUTLASS composition behind fp8_block_gemm (fp8_block_gemm.hpp), one instantiation per
// output orientation (fp8_block_gemm_token_major.cu, fp8_block_gemm_transposed.cu). In CUTLASS's
// terms: A = x (M = rows, K-major, one scale per row and 128 of k: granularity 1 x 128, the
// scales M-major), B = W (N = out, K-major, one scale per 128 x 128 block, the scales K-major),
// D = y in e4m3 through ScaledAcc (scale * acc, one rounding), row-major D for token-major y,
// column-major D for transposed y.
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cute/tensor.hpp>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include <cstdint>

#include "cuda/common/runtime.hpp"
#include "cuda/model/fp8_block_gemm.hpp"
#include "fp8mla/error.hpp"

namespace fp8mla::cuda::model::detail {

using namespace cute;

// 128 x 128 tiles (the scale blocks' size along N and K), two consumer warpgroups sharing each
// tile (cooperative), persistent over the tiles.
template <typename LayoutD>
struct Fp8BlockGemmKernel {
  using Element = cutlass::float_e4m3_t;
  using TileShape = Shape<_128, _128, _128>;
  using ClusterShape = Shape<_1, _1, _1>;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::MN,
                                                                cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  static constexpr int kAlignment = 16;  // elements of 1 byte: TMA's 16 bytes

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignment,
      Element, LayoutD, kAlignment, cutlass::epilogue::TmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::ScaledAcc<Element, float, float>>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element,
      cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, kAlignment, Element,
      cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, kAlignment, float, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

inline void check_cutlass(cutlass::Status status, const char* what) {
  if (status == cutlass::Status::kSuccess) return;
  throw Error(
      status == cutlass::Status::kErrorInternal ? ErrorCategory::kCuda
                                                : ErrorCategory::kUnsupported,
      concat("fp8_block_gemm: CUTLASS ", what, " failed: ", cutlassGetStatusString(status)));
}

// Runs the GEMM of the params (checked by the caller) with D laid out as LayoutD.
template <typename LayoutD>
void run_fp8_block_gemm(const Fp8BlockGemmParams& p, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream) {
  using K = Fp8BlockGemmKernel<LayoutD>;
  using Gemm = typename K::Gemm;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  const int M = int(p.rows), N = int(p.out), Kd = int(p.in);
  const int k_blocks = Kd / 128;

  StrideA stride_a{};
  get<0>(stride_a) = p.in;  // x: row r at r * in
  StrideB stride_b{};
  get<0>(stride_b) = p.in;  // W: row o at o * in
  StrideD stride_d{};
  if constexpr (std::is_same_v<LayoutD, cutlass::layout::RowMajor>) {
    get<0>(stride_d) = p.y_pitch;
  } else {
    get<1>(stride_d) = p.y_pitch;
  }
  // The scale layouts of the config with the callers' pitches: x's scales M-major with a pitch
  // of x_scale_pitch per group, W's K-major with weight_scale_pitch per 128 rows.
  typename K::LayoutSFA layout_sfa =
      K::ScaleConfig::tile_atom_to_shape_SFA(make_shape(M, N, Kd, 1));
  typename K::LayoutSFB layout_sfb =
      K::ScaleConfig::tile_atom_to_shape_SFB(make_shape(M, N, Kd, 1));
  layout_sfa =
      typename K::LayoutSFA(layout_sfa.shape(), make_stride(make_stride(_0{}, _1{}),
                                                            make_stride(_0{}, int(p.x_scale_pitch)),
                                                            int(p.x_scale_pitch * k_blocks)));
  layout_sfb = typename K::LayoutSFB(
      layout_sfb.shape(),
      make_stride(make_stride(_0{}, int(p.weight_scale_pitch)), make_stride(_0{}, _1{}),
                  int(p.weight_scale_pitch * (p.out / 128))));

  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, Kd, 1},
      {static_cast<const typename K::Element*>(p.x), stride_a,
       static_cast<const typename K::Element*>(p.weight), stride_b, p.x_scales, layout_sfa,
       p.weight_scales, layout_sfb},
      {{}, nullptr, stride_d, static_cast<typename K::Element*>(p.y), stride_d}};
  args.epilogue.thread.alpha = p.scale;
  // The SM count from fp8mla's cache (else CUTLASS queries the device on every call).
  const DeviceProps& device = current_device_props();
  args.hw_info.device_id = device.ordinal;
  args.hw_info.sm_count = device.sm_count;

  Gemm gemm;
  check_cutlass(gemm.can_implement(args), "can_implement");
  if (Gemm::get_workspace_size(args) > workspace_bytes) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("fp8_block_gemm: expected a workspace of at least ",
                       Gemm::get_workspace_size(args), " bytes, got ", workspace_bytes));
  }
  check_cutlass(gemm.initialize(args, workspace, stream), "initialize");
  check_cutlass(gemm.run(stream), "run");
}

}  // namespace fp8mla::cuda::model::detail
