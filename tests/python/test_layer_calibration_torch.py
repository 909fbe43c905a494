"""fp8mla.MlaLayer.calibrate with torch tensors on the GPU against the CPU layer's calibration of
the same batch (numpy): the same steps, the projections summed in another order (cuBLASLt), so
each amax and scale within 2%; and the calibrated scales plugged into a CUDA prefill."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402
from torch_helpers import needs_gpu  # noqa: E402

PAGE = 16


@needs_gpu
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_cuda_calibration_equals_the_cpu_calibration(fmt):
    weights = fp8mla.generate_mla_weights("tiny", fmt, seed=4)
    width = weights.config.hidden
    hidden = np.random.default_rng(2).standard_normal((50, width)).astype(ml_dtypes.bfloat16)
    batch = [(0, 30, range(30)), (64, 20, range(100, 184))]
    cpu = fp8mla.MlaLayer(None, weights).calibrate(hidden, batch)
    gpu_layer = fp8mla.MlaLayer(None, weights, device="cuda")
    hidden_gpu = torch.from_numpy(hidden.astype(np.float32)).to(torch.bfloat16).cuda()  # exact
    gpu = gpu_layer.calibrate(hidden_gpu, batch)
    print(f"amax cuda {gpu.amax}, cpu {cpu.amax}")
    for key in ("q", "k", "v", "cache"):
        assert gpu.amax[key] == pytest.approx(cpu.amax[key], rel=0.02), key
        assert getattr(gpu, f"{key}_scale_inv") == pytest.approx(
            getattr(cpu, f"{key}_scale_inv"), rel=0.02), key
    cache = torch.zeros((16, PAGE, 576), dtype=torch.float8_e4m3fn, device="cuda")
    out = gpu_layer.prefill(hidden_gpu, batch, cache, **gpu.prefill_options())
    assert out.shape == (50, width) and torch.isfinite(out.float()).all()
