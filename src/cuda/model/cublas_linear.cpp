#include "cuda/model/cublas_linear.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <unordered_map>

#include "cuda/common/runtime.hpp"
#include "fp8mla/error.hpp"
#include "model/fp8_gemm_rule.hpp"

namespace fp8mla::cuda::model {

namespace {

constexpr std::int64_t kGroup = 128;
// cuBLASLt's VEC128 / BLK128x128 modes need N (the GEMM's column count: rows) % 4 == 0 (cuBLAS
// docs 3.1.4.5.1); other row counts run as a multiple of 4 plus a padded 4-row GEMM.
constexpr std::int64_t kTailRows = 4;
constexpr std::size_t kScratchAlign = 256;  // what cuBLASLt wants of its workspace

// Throws an Error naming `what` and the cuBLAS status: kUnsupported for configurations cuBLASLt
// refuses, kCuda otherwise.
void check_cublas(cublasStatus_t status, const char* what,
                  std::source_location where = std::source_location::current()) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const bool unsupported =
      status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_ARCH_MISMATCH;
  throw Error(unsupported ? ErrorCategory::kUnsupported : ErrorCategory::kCuda,
              concat(what, " failed: ", cublasLtGetStatusName(status), " (",
                     cublasLtGetStatusString(status), ")"),
              where);
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value,
              const char* what) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), what);
}

template <typename T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              const T& value, const char* what) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)), what);
}

bool aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

std::size_t align_up(std::size_t bytes) {
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

cudaDataType_t input_type(LinearFormat format) {
  return format == LinearFormat::kFp8Block ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
}

std::string describe(const LinearWeight& w) {
  return concat(w.format == LinearFormat::kFp8Block ? "fp8 block" : "bf16", " projection [out ",
                w.out, ", in ", w.in, "]");
}

// Workspace carved out for an fp8 run whose row count is not a multiple of 4: the x scales of the
// first `main_rows` rows repacked with a row stride of main_rows, and the last rows % 4 rows (x,
// their scales, y) padded to a 4-row GEMM. cuBLASLt gets the rest of the workspace.
struct Scratch {
  std::size_t main_scales = 0, tail_x = 0, tail_scales = 0, tail_y = 0, total = 0;
};

Scratch scratch_layout(std::int64_t out, std::int64_t in, std::int64_t main_rows) {
  const auto groups = std::size_t(in / kGroup);
  Scratch s;
  std::size_t at = 0;
  s.main_scales = at;
  at += align_up(groups * std::size_t(main_rows) * sizeof(float));
  s.tail_x = at;
  at += align_up(std::size_t(kTailRows * in));
  s.tail_scales = at;
  at += align_up(groups * kTailRows * sizeof(float));
  s.tail_y = at;
  at += align_up(std::size_t(kTailRows * out) * 2);
  s.total = at;
  return s;
}

}  // namespace

struct CublasLinear::Descriptors {
  struct Algo {
    cublasLtMatmulAlgo_t algo{};
    std::size_t workspace = 0;
  };
  // One GEMM shape: the B (x) and D (y) layouts for `n` rows and cuBLASLt's algorithm for them.
  struct Plan {
    cublasLtMatrixLayout_t b = nullptr, d = nullptr;
    std::int64_t n = 0;  // 0 until the layouts' row count has an algorithm
    Algo algo;
  };

  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t matmul = nullptr;
  cublasLtMatrixLayout_t a = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  std::uint32_t alignment = 16;  // of x, W and y, as the heuristic was told to assume
  Plan main;                     // rows (bf16), or rows rounded down to a multiple of 4 (fp8)
  Plan tail;                     // fp8 only: the padded 4-row GEMM
  // Heuristic results of `main` by row count: asking cuBLASLt again costs host time in run().
  std::unordered_map<std::int64_t, Algo> main_algos;

  ~Descriptors() {
    for (Plan* plan : {&main, &tail}) {
      if (plan->b) cublasLtMatrixLayoutDestroy(plan->b);
      if (plan->d) cublasLtMatrixLayoutDestroy(plan->d);
    }
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (matmul) cublasLtMatmulDescDestroy(matmul);
  }

  // Column-major views of the row-major tensors: B = x is in x n (ld in), D = y is out x n
  // (ld out).
  static void create_layouts(Plan& plan, const LinearWeight& w, std::int64_t n) {
    check_cublas(cublasLtMatrixLayoutCreate(&plan.b, input_type(w.format), std::uint64_t(w.in),
                                            std::uint64_t(n), w.in),
                 "cublasLtMatrixLayoutCreate(B)");
    check_cublas(cublasLtMatrixLayoutCreate(&plan.d, CUDA_R_16BF, std::uint64_t(w.out),
                                            std::uint64_t(n), w.out),
                 "cublasLtMatrixLayoutCreate(D)");
  }

  static void set_rows(Plan& plan, std::int64_t n) {
    plan.n = 0;  // stays 0 if anything below throws
    const auto cols = std::uint64_t(n);
    check_cublas(
        cublasLtMatrixLayoutSetAttribute(plan.b, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols)),
        "cublasLtMatrixLayoutSetAttribute(B cols)");
    check_cublas(
        cublasLtMatrixLayoutSetAttribute(plan.d, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols)),
        "cublasLtMatrixLayoutSetAttribute(D cols)");
  }

  // Asks cuBLASLt for its best algorithm for the plan's layouts (n rows); false when it has none.
  bool find_algo(Plan& plan, std::int64_t n) const {
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, matmul, a, plan.b, plan.d,
                                                                 plan.d, pref, 1, &result, &count);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
    check_cublas(status, "cublasLtMatmulAlgoGetHeuristic");
    if (count == 0 || result.state != CUBLAS_STATUS_SUCCESS) return false;
    plan.algo = {result.algo, result.workspaceSize};
    plan.n = n;
    return true;
  }
};

CublasLinear::CublasLinear(cublasLtHandle_t handle, const LinearWeight& weight,
                           std::int64_t max_rows)
    : weight_(weight), max_rows_(max_rows), handle_(handle), desc_(nullptr) {
  const bool fp8 = weight.format == LinearFormat::kFp8Block;
  if (handle == nullptr) {
    throw Error(ErrorCategory::kInvalidArgument,
                "CublasLinear: expected a cuBLASLt handle, got null");
  }
  if (weight.out <= 0 || weight.in <= 0 || max_rows <= 0) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("CublasLinear: expected out, in and max_rows > 0, got out ", weight.out,
                       ", in ", weight.in, ", max_rows ", max_rows));
  }
  if (weight.weight == nullptr || !aligned(weight.weight, 16)) {
    throw Error(
        ErrorCategory::kInvalidArgument,
        concat("CublasLinear: ", describe(weight),
               " expected a 16-byte aligned device pointer for the weight, got ", weight.weight));
  }
  if (fp8) {
    if (weight.scale_inv == nullptr || !aligned(weight.scale_inv, 16)) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("CublasLinear: ", describe(weight),
                         " expected a 16-byte aligned device pointer for scale_inv (f32 "
                         "[ceil(out/128), linear_scale_columns(in)]), got ",
                         weight.scale_inv));
    }
    if (!fp8mla::model::fp8_gemm_shape(weight.out, weight.in)) {
      throw Error(
          ErrorCategory::kUnsupported,
          concat("CublasLinear: ", describe(weight), " needs in % ", kWeightBlock,
                 " == 0 (whole 128 x 128 scale blocks) and out % ",
                 fp8mla::model::kFp8GemmOutMultiple,
                 " == 0 (cuBLASLt's fp8 kernels want 16-byte aligned bf16 output rows), got in % ",
                 kWeightBlock, " = ", weight.in % kWeightBlock, ", out % ",
                 fp8mla::model::kFp8GemmOutMultiple, " = ",
                 weight.out % fp8mla::model::kFp8GemmOutMultiple));
    }
    if (cublasLtGetVersion() < 120900) {
      throw Error(ErrorCategory::kUnsupported,
                  concat("CublasLinear: ", describe(weight),
                         " needs cuBLASLt >= 12.9.0 (VEC128 / BLK128x128 scale modes), got "
                         "version ",
                         cublasLtGetVersion()));
    }
  }

  auto desc = std::make_unique<Descriptors>();
  desc->handle = handle;
  check_cublas(cublasLtMatmulDescCreate(&desc->matmul, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  set_desc(desc->matmul, CUBLASLT_MATMUL_DESC_TRANSA, transa, "set TRANSA");
  set_desc(desc->matmul, CUBLASLT_MATMUL_DESC_TRANSB, transb, "set TRANSB");
  if (fp8) {
    // FAST_ACCUM stays at its default (off): block scaling does not take it.
    const std::int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const std::int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    set_desc(desc->matmul, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode, "set A_SCALE_MODE");
    set_desc(desc->matmul, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode, "set B_SCALE_MODE");
    const void* a_scale = weight.scale_inv;
    set_desc(desc->matmul, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale, "set A_SCALE_POINTER");
    // The heuristic refuses a block-scaled B without a scale pointer; run() sets the real one.
    set_desc(desc->matmul, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scale, "set B_SCALE_POINTER");
  }
  // A = W: in x out column-major (ld in), used transposed.
  check_cublas(
      cublasLtMatrixLayoutCreate(&desc->a, input_type(weight.format), std::uint64_t(weight.in),
                                 std::uint64_t(weight.out), weight.in),
      "cublasLtMatrixLayoutCreate(A)");

  check_cublas(cublasLtMatmulPreferenceCreate(&desc->pref), "cublasLtMatmulPreferenceCreate");
  const std::uint64_t max_workspace = kLinearWorkspaceBytes;
  set_pref(desc->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace,
           "set MAX_WORKSPACE_BYTES");
  // Split-K partial sums in f32 only: INPLACE / OUTPUT_TYPE schemes round each partial to bf16.
  const std::uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  set_pref(desc->pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction,
           "set REDUCTION_SCHEME_MASK");
  const char* needs = fp8 ? " (cuBLASLt's 128-element block scaling runs on sm_90 only)" : "";
  const std::int64_t main_rows =
      fp8 ? std::max(kTailRows, max_rows / kTailRows * kTailRows) : max_rows;
  Descriptors::create_layouts(desc->main, weight, main_rows);
  if (fp8) Descriptors::create_layouts(desc->tail, weight, kTailRows);
  // Kernels that take 16-byte aligned x, W and y (views into larger buffers) if there are any;
  // else cuBLASLt's default assumption, 256.
  bool found = false;
  for (const std::uint32_t alignment : {16u, 256u}) {
    for (const auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      set_pref(desc->pref, attr, alignment, "set MIN_ALIGNMENT");
    }
    desc->alignment = alignment;
    found =
        desc->find_algo(desc->main, main_rows) && (!fp8 || desc->find_algo(desc->tail, kTailRows));
    if (found) break;
  }
  if (!found) {
    throw Error(ErrorCategory::kUnsupported,
                concat("CublasLinear: cuBLASLt has no algorithm for ", describe(weight),
                       " with max_rows ", max_rows, " on this device", needs));
  }
  desc->main_algos.emplace(main_rows, desc->main.algo);
  if (!aligned(weight.weight, desc->alignment)) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("CublasLinear: ", describe(weight), " expected a ", desc->alignment,
                       "-byte aligned device pointer for the weight, got ", weight.weight));
  }
  desc_ = desc.release();
}

std::size_t linear_scratch_bytes(const LinearWeight& weight, std::int64_t rows) {
  if (weight.format != LinearFormat::kFp8Block || rows % kTailRows == 0) return 0;
  return scratch_layout(weight.out, weight.in, rows / kTailRows * kTailRows).total;
}

CublasLinear::~CublasLinear() {
  delete desc_;
}

void CublasLinear::run(const void* x, const float* x_scales, std::int64_t rows, void* y,
                       void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  const bool fp8 = weight_.format == LinearFormat::kFp8Block;
  if (rows < 0 || rows > max_rows_) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("CublasLinear::run: ", describe(weight_), " expected 0 <= rows <= max_rows ",
                       max_rows_, ", got rows ", rows));
  }
  if (rows == 0) return;
  const auto check_pointer = [&](const void* p, std::size_t alignment, const char* name) {
    if (p == nullptr || !aligned(p, alignment)) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("CublasLinear::run: ", describe(weight_), " expected a ", alignment,
                         "-byte aligned device pointer for ", name, ", got ", p));
    }
  };
  check_pointer(x, desc_->alignment, fp8 ? "x (e4m3 [rows, in])" : "x (bf16 [rows, in])");
  if (fp8) check_pointer(x_scales, 16, "x_scales (f32 [in/128][rows])");
  check_pointer(y, desc_->alignment, "y (bf16 [rows, out])");
  if (reinterpret_cast<std::uintptr_t>(workspace) % kScratchAlign != 0) {
    throw Error(
        ErrorCategory::kInvalidArgument,
        concat("CublasLinear::run: expected a 256-byte aligned workspace, got ", workspace));
  }

  Descriptors& d = *desc_;
  const std::int64_t main_rows = fp8 ? rows / kTailRows * kTailRows : rows;
  const std::int64_t tail_rows = rows - main_rows;
  if (main_rows > 0 && main_rows != d.main.n) {
    Descriptors::set_rows(d.main, main_rows);
    const auto cached = d.main_algos.find(main_rows);
    if (cached != d.main_algos.end()) {
      d.main.algo = cached->second;
      d.main.n = main_rows;
    } else {
      if (fp8) {
        // The heuristic wants a B scale pointer; the one of the launch is set right before it.
        set_desc(d.matmul, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(x_scales),
                 "set B_SCALE_POINTER");
      }
      if (!d.find_algo(d.main, main_rows)) {
        throw Error(ErrorCategory::kUnsupported,
                    concat("CublasLinear::run: cuBLASLt has no algorithm for ", describe(weight_),
                           " with ", main_rows, " rows"));
      }
      d.main_algos.emplace(main_rows, d.main.algo);
    }
  }

  const Scratch scratch =
      tail_rows > 0 ? scratch_layout(weight_.out, weight_.in, main_rows) : Scratch{};
  std::size_t algo_workspace = 0;
  if (main_rows > 0) algo_workspace = d.main.algo.workspace;
  if (tail_rows > 0) algo_workspace = std::max(algo_workspace, d.tail.algo.workspace);
  const std::size_t needed = scratch.total + algo_workspace;
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("CublasLinear::run: ", describe(weight_), " with ", rows,
                       " rows expected a workspace of at least ", needed, " bytes (", scratch.total,
                       " scratch + ", algo_workspace, " for cuBLASLt), got ", workspace_bytes,
                       " bytes at ", workspace));
  }
  auto* ws = static_cast<char*>(workspace);
  void* lt_workspace = ws == nullptr ? nullptr : ws + scratch.total;
  const std::size_t lt_workspace_bytes = workspace_bytes - scratch.total;
  const float alpha = 1.0f, beta = 0.0f;
  const auto launch = [&](const Descriptors::Plan& plan, const void* b, void* out,
                          const float* b_scales) {
    if (fp8) {
      // Read when the matmul is enqueued: changing it afterwards does not touch earlier launches.
      set_desc(d.matmul, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(b_scales),
               "set B_SCALE_POINTER");
    }
    check_cublas(cublasLtMatmul(handle_, d.matmul, &alpha, weight_.weight, d.a, b, plan.b, &beta,
                                out, plan.d, out, plan.d, &plan.algo.algo, lt_workspace,
                                lt_workspace_bytes, stream),
                 "cublasLtMatmul");
  };

  if (tail_rows == 0) {
    launch(d.main, x, y, x_scales);
    return;
  }
  // fp8, rows % 4 != 0: cuBLASLt reads B's scales with a row stride of N, so the first main_rows
  // rows run on a repacked copy of their scales and the last ones as a 4-row GEMM.
  const auto groups = std::size_t(weight_.in / kGroup);
  const std::size_t scale_pitch = std::size_t(rows) * sizeof(float);
  if (main_rows > 0) {
    auto* main_scales = reinterpret_cast<float*>(ws + scratch.main_scales);
    const std::size_t main_pitch = std::size_t(main_rows) * sizeof(float);
    check(cudaMemcpy2DAsync(main_scales, main_pitch, x_scales, scale_pitch, main_pitch, groups,
                            cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpy2DAsync(x scales)");
    launch(d.main, x, y, main_scales);
  }
  char* tail_x = ws + scratch.tail_x;
  auto* tail_scales = reinterpret_cast<float*>(ws + scratch.tail_scales);
  char* tail_y = ws + scratch.tail_y;
  // The pad rows feed only dropped columns, but they are read: give them defined values.
  const std::int64_t pad_rows = kTailRows - tail_rows;
  check(cudaMemsetAsync(tail_x + tail_rows * weight_.in, 0, std::size_t(pad_rows * weight_.in),
                        stream),
        "cudaMemsetAsync(x tail pad)");
  check(cudaMemset2DAsync(tail_scales + tail_rows, kTailRows * sizeof(float), 0,
                          std::size_t(pad_rows) * sizeof(float), groups, stream),
        "cudaMemset2DAsync(x tail scales pad)");
  check(cudaMemcpyAsync(tail_x, static_cast<const char*>(x) + main_rows * weight_.in,
                        std::size_t(tail_rows * weight_.in), cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync(x tail)");
  check(cudaMemcpy2DAsync(tail_scales, kTailRows * sizeof(float), x_scales + main_rows, scale_pitch,
                          std::size_t(tail_rows) * sizeof(float), groups, cudaMemcpyDeviceToDevice,
                          stream),
        "cudaMemcpy2DAsync(x tail scales)");
  launch(d.tail, tail_x, tail_y, tail_scales);
  check(cudaMemcpyAsync(static_cast<char*>(y) + main_rows * weight_.out * 2, tail_y,
                        std::size_t(tail_rows * weight_.out) * 2, cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync(y tail)");
}

CublasLtHandle::CublasLtHandle() {
  check_cublas(cublasLtCreate(&handle_), "cublasLtCreate");
}

CublasLtHandle::~CublasLtHandle() {
  if (handle_) cublasLtDestroy(handle_);
}

}  // namespace fp8mla::cuda::model
