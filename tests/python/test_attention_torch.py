"""prefill_attention through torch: the CPU path and, with a CUDA build on a GPU, the Hopper
kernel (e4m3 with V transposed by mla_kv_pack_quantize_fp8, and bf16) against the float64
reference within the error of an e4m3 P; e4m3 V token-major gives the transposed V's bytes;
torch.compile(fullgraph=True) and CUDA graph replay give the eager bytes. Skipped (visibly)
without torch or a GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import fp8mla  # noqa: E402
import fp8mla.torch_ops  # noqa: E402,F401
from attention_reference import reference  # noqa: E402
from torch_helpers import needs_gpu  # noqa: E402

DQK = 192

def torch_inputs(q_lens, k_lens, heads, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(q_lens), sum(k_lens)
    q = (torch.rand(tq, heads, DQK, generator=g) * 4 - 2).to(torch.bfloat16).to(device)
    kv = (torch.rand(tk, heads, 256, generator=g) * 4 - 2).to(torch.bfloat16).to(device)
    k_pe = (torch.rand(tk, 64, generator=g) * 4 - 2).to(torch.bfloat16).to(device)
    cu_q = torch.tensor([0] + list(np.cumsum(q_lens)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(np.cumsum(k_lens)), dtype=torch.int32, device=device)
    return q, kv, k_pe, cu_q, cu_k


def packed_fp8(q, kv, k_pe, device, scale_inv=4.0):
    """e4m3 q; k and transposed v from the prefix-pack op, the path an engine uses."""
    tk, heads = kv.shape[0], kv.shape[1]
    q8 = (q.float() * scale_inv).to(torch.float8_e4m3fn)
    pitch = (tk + 15) // 16 * 16
    v_store = torch.empty(heads, 128, pitch, dtype=torch.float8_e4m3fn, device=device)
    v_out = v_store[:, :, :tk].permute(2, 0, 1)
    k_out, _ = fp8mla.mla_kv_pack_quantize_fp8(kv[..., :128], k_pe, kv[..., 128:],
                                               k_scale_inv=scale_inv, v_scale_inv=scale_inv,
                                               v_out=v_out, v_layout="transposed")
    return q8, k_out, v_out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_torch_matches_reference(device, dtype):
    q_lens, k_lens = [1, 130, 0, 257], [1, 200, 5, 257]
    q, kv, k_pe, cu_q, cu_k = torch_inputs(q_lens, k_lens, 4, device)
    scale = 1 / math.sqrt(DQK)
    if dtype == "bf16":
        k = torch.cat([kv[..., :128], k_pe[:, None, :].expand(-1, 4, -1)], dim=-1)
        v = kv[..., 128:]
        out, lse = fp8mla.prefill_attention(q, k, v, cu_q, cu_k, 257, 257, softmax_scale=scale,
                                            return_lse=True)
        qf, kf, vf = q.double(), k.double(), v.double()
        tol = 2e-2
    else:
        q8, k8, v8 = packed_fp8(q, kv, k_pe, device)
        d = torch.tensor([0.25], device=device)
        out, lse = fp8mla.prefill_attention(q8, k8, v8, cu_q, cu_k, 257, 257, softmax_scale=scale,
                                            q_descale=d, k_descale=d, v_descale=d,
                                            return_lse=True)
        qf, kf, vf = (x.double() * 0.25 for x in (q8, k8, v8))
        tol = 8e-2  # P rounded to e4m3
    ref_out, ref_lse = reference(qf.cpu().numpy(), kf.cpu().numpy(), vf.cpu().numpy(),
                                 cu_q.cpu().numpy(), cu_k.cpu().numpy(), scale, True)
    np.testing.assert_allclose(out.double().cpu().numpy(), ref_out, atol=tol)
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=1e-3)


@needs_gpu
def test_torch_compile_and_cuda_graph():
    q, kv, k_pe, cu_q, cu_k = torch_inputs([300, 64], [300, 64], 8, "cuda", seed=5)
    q8, k8, v8 = packed_fp8(q, kv, k_pe, "cuda")
    d = torch.tensor([0.25], device="cuda")

    def attend(q8, k8, v8):
        return fp8mla.prefill_attention(q8, k8, v8, cu_q, cu_k, 300, 300, softmax_scale=0.07,
                                        q_descale=d, k_descale=d, v_descale=d)

    eager = attend(q8, k8, v8)
    compiled = torch.compile(attend, fullgraph=True)(q8, k8, v8)
    assert torch.equal(compiled.view(torch.int16), eager.view(torch.int16))
    out = torch.empty_like(eager)
    static = lambda: fp8mla.prefill_attention(  # noqa: E731
        q8, k8, v8, cu_q, cu_k, 300, 300, softmax_scale=0.07, q_descale=d, k_descale=d,
        v_descale=d, out=out)
    static()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))


@needs_gpu
def test_torch_e4m3_token_major_v_gives_the_transposed_bytes():
    """e4m3 v token-major (a contiguous copy, as engines pass it) gives on CUDA the bytes of the
    transposed v the pack writes: the kernel transposes its tiles in shared memory."""
    q_lens, k_lens = [1, 130, 0, 257, 77], [1, 200, 5, 300, 77]
    q, kv, k_pe, cu_q, cu_k = torch_inputs(q_lens, k_lens, 16, "cuda", seed=3)
    q8, k8, v8 = packed_fp8(q, kv, k_pe, "cuda")
    v_token_major = v8.contiguous()
    assert v8.stride(0) == 1 and v_token_major.stride(2) == 1
    d = torch.tensor([0.25], device="cuda")
    for causal in (True, False):
        def attend(v):
            return fp8mla.prefill_attention(q8, k8, v, cu_q, cu_k, 257, 300, softmax_scale=0.07,
                                            causal=causal, q_descale=d, k_descale=d,
                                            v_descale=d, return_lse=True)
        out_t, lse_t = attend(v8)
        out_m, lse_m = attend(v_token_major)
        assert torch.equal(out_m.view(torch.int16), out_t.view(torch.int16))
        assert torch.equal(lse_m.view(torch.int32), lse_t.view(torch.int32))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_torch_k_rope_gives_the_bytes_of_the_packed_k(device):
    """k as its per-head 128 dims (a view of the packed k, so its rows run on past them) and
    k_rope [Tk, 64] once per key give the bytes of the packed k, eager and compiled."""
    q_lens, k_lens = [1, 130, 0, 257, 77], [1, 200, 5, 300, 77]
    q, kv, k_pe, cu_q, cu_k = torch_inputs(q_lens, k_lens, 16, device, seed=4)
    q8, k8, v8 = packed_fp8(q, kv, k_pe, device)
    k_rope = k8[:, 0, 128:].contiguous()
    d = torch.tensor([0.25], device=device)

    def attend(k, k_rope):
        return fp8mla.prefill_attention(q8, k, v8, cu_q, cu_k, 257, 300, softmax_scale=0.07,
                                        q_descale=d, k_descale=d, v_descale=d, k_rope=k_rope,
                                        return_lse=True)

    out_packed, lse_packed = attend(k8, None)
    for rope in (k_rope, k_rope[:, None, :]):
        out, lse = attend(k8[..., :128], rope)
        assert torch.equal(out.view(torch.int16), out_packed.view(torch.int16))
        assert torch.equal(lse.view(torch.int32), lse_packed.view(torch.int32))
    out, lse = torch.compile(attend, fullgraph=True)(k8[..., :128], k_rope)
    assert torch.equal(out.view(torch.int16), out_packed.view(torch.int16))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_torch_prior_state_folds_like_the_merge(device, dtype):
    """A prefix chunk's call folding the running state (prior_out / prior_lse) gives the bytes of
    the call followed by merge_attention_states on the same device, apart and in place, eager and
    compiled (on CUDA the folding kernel merges in its epilogue)."""
    q_lens, k_lens = [1, 130, 0, 257, 77], [1, 200, 5, 300, 0]
    q, kv, k_pe, cu_q, cu_k = torch_inputs(q_lens, k_lens, 4, device, seed=6)
    if dtype == "bf16":
        k = torch.cat([kv[..., :128], k_pe[:, None, :].expand(-1, 4, -1)], dim=-1)
        v, scales = kv[..., 128:].contiguous(), {}
    else:
        q, k, v = packed_fp8(q, kv, k_pe, device)
        d = torch.tensor([0.25], device=device)
        scales = dict(q_descale=d, k_descale=d, v_descale=d)
    g = torch.Generator().manual_seed(8)
    prior_out = (torch.rand(q.shape[0], 4, 128, generator=g) * 4 - 2).to(torch.bfloat16)
    prior_lse = torch.rand(q.shape[0], 4, generator=g) * 6 - 1
    prior_lse[::7, 1] = -math.inf
    prior_out, prior_lse = prior_out.to(device), prior_lse.to(device)

    def attend(prior_out=None, prior_lse=None, out=None, lse=None):
        return fp8mla.prefill_attention(q, k, v, cu_q, cu_k, 257, 300, softmax_scale=0.07,
                                        causal=False, return_lse=True, prior_out=prior_out,
                                        prior_lse=prior_lse, out=out, lse=lse, **scales)

    own_out, own_lse = attend()
    want_out, want_lse = fp8mla.merge_attention_states(prior_out, prior_lse, own_out, own_lse)
    out, lse = attend(prior_out, prior_lse)
    assert torch.equal(out.view(torch.int16), want_out.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), want_lse.view(torch.int32))
    out, lse = torch.compile(attend, fullgraph=True)(prior_out, prior_lse)
    assert torch.equal(out.view(torch.int16), want_out.view(torch.int16))
    state, state_lse = prior_out.clone(), prior_lse.clone()
    attend(state, state_lse, state, state_lse)
    assert torch.equal(state.view(torch.int16), want_out.view(torch.int16))
    assert torch.equal(state_lse.view(torch.int32), want_lse.view(torch.int32))
