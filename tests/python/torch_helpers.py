"""What the torch tests share: the GPU marker, byte views of tensors for exact comparisons, and
CUDA graph capture. Import it after pytest.importorskip("torch")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fp8mla

HAS_GPU = torch.cuda.is_available() and fp8mla.info()["cuda"] and bool(fp8mla.info()["devices"])
needs_gpu = pytest.mark.skipif(
    not HAS_GPU, reason="needs a CUDA GPU visible to torch and an fp8mla built with CUDA")


def as_bytes(t: torch.Tensor) -> np.ndarray:
    """t's elements as raw integers (fp8 as uint8, 16-bit floats as int16), contiguous."""
    t = t.detach().cpu().contiguous()
    if t.dtype.itemsize == 1 and t.dtype != torch.uint8:
        t = t.view(torch.uint8)
    elif t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return t.numpy()


def to_numpy(x: torch.Tensor) -> np.ndarray:
    """x as a contiguous numpy array (bf16 as ml_dtypes.bfloat16)."""
    x = x.detach().cpu()
    if x.dtype == torch.bfloat16:
        import ml_dtypes

        return x.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.contiguous().numpy()


def assert_same(a: torch.Tensor, b: torch.Tensor):
    """Same shape, dtype and bytes."""
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(as_bytes(a), as_bytes(b))


def assert_identical(a: torch.Tensor, b: torch.Tensor):
    """Same shape, dtype, strides and bytes."""
    assert a.stride() == b.stride()
    assert_same(a, b)


def capture(step) -> torch.cuda.CUDAGraph:
    """A CUDA graph of step(), warmed up once on a side stream outside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph
