"""prefill_attention and merge_attention_states through numpy (the CPU path) against the float64
reference of attention_reference.py: bf16 and e4m3 with descales, ragged with an empty sequence,
causal and not, transposed V, merge of two key halves, errors. Skipped without ml_dtypes."""

from __future__ import annotations

import math

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402
from attention_reference import reference  # noqa: E402

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
DQK, DV = 192, 128


def ragged(q_lens, k_lens, heads, dtype, seed):
    rng = np.random.default_rng(seed)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32)
    q = rng.uniform(-2, 2, (cu_q[-1], heads, DQK)).astype(np.float32).astype(dtype)
    k = rng.uniform(-2, 2, (cu_k[-1], heads, DQK)).astype(np.float32).astype(dtype)
    v = rng.uniform(-2, 2, (cu_k[-1], heads, DV)).astype(np.float32).astype(dtype)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("dtype", [BF16, E4M3], ids=["bf16", "e4m3"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_numpy_matches_reference(dtype, causal):
    q_lens, k_lens = [5, 0, 40], [9, 3, 40]
    q, k, v, cu_q, cu_k = ragged(q_lens, k_lens, 3, dtype, 1)
    descale = np.float32(0.5)
    kwargs = {}
    if dtype == E4M3:
        kwargs = dict(q_descale=descale, k_descale=descale, v_descale=descale)
    scale = 1 / math.sqrt(DQK)
    out, lse = fp8mla.prefill_attention(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens),
                                        softmax_scale=scale, causal=causal, return_lse=True,
                                        **kwargs)
    d = float(descale) if dtype == E4M3 else 1.0
    ref_out, ref_lse = reference(q.astype(np.float64) * d, k.astype(np.float64) * d,
                                 v.astype(np.float64) * d, cu_q, cu_k, scale, causal)
    np.testing.assert_allclose(out.astype(np.float64), ref_out, atol=2e-2, rtol=1e-2)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4)


@pytest.mark.parametrize("dtype", [BF16, E4M3], ids=["bf16", "e4m3"])
def test_numpy_k_rope_gives_the_output_of_k_with_rope_in_every_head(dtype):
    q, k, v, cu_q, cu_k = ragged([5, 0, 40], [9, 3, 40], 3, dtype, 4)
    k[:, 1:, 128:] = k[:, :1, 128:]  # MLA's K: the RoPE part is the same for every head
    kwargs = {}
    if dtype == E4M3:
        one = np.float32(1.0)
        kwargs = dict(q_descale=one, k_descale=one, v_descale=one)
    whole = fp8mla.prefill_attention(q, k, v, cu_q, cu_k, 40, 40, softmax_scale=0.1,
                                     return_lse=True, **kwargs)
    k_nope = k.copy()
    k_nope[:, :, 128:] = 7  # not read: the per-head view below stops at 128
    for k_rope in (np.ascontiguousarray(k[:, 0, 128:]), k[:, :1, 128:]):
        split = fp8mla.prefill_attention(q, k_nope[:, :, :128], v, cu_q, cu_k, 40, 40,
                                         softmax_scale=0.1, return_lse=True, k_rope=k_rope,
                                         **kwargs)
        np.testing.assert_array_equal(whole[0].view(np.uint16), split[0].view(np.uint16))
        np.testing.assert_array_equal(whole[1], split[1])
    with pytest.raises(ValueError, match="`k`: expected"):
        fp8mla.prefill_attention(q, k, v, cu_q, cu_k, 40, 40, softmax_scale=0.1,
                                 k_rope=k[:, 0, 128:], **kwargs)


def test_numpy_transposed_v_and_merge():
    q, k, v, cu_q, cu_k = ragged([7, 30], [7, 30], 2, BF16, 2)
    scale = 0.1
    v_t = np.ascontiguousarray(v.transpose(1, 2, 0)).transpose(2, 0, 1)  # keys contiguous
    a = fp8mla.prefill_attention(q, k, v, cu_q, cu_k, 30, 30, softmax_scale=scale,
                                 return_lse=True)
    b = fp8mla.prefill_attention(q, k, v_t, cu_q, cu_k, 30, 30, softmax_scale=scale,
                                 return_lse=True)
    np.testing.assert_array_equal(a[0].view(np.uint16), b[0].view(np.uint16))
    # The keys of one sequence split in two, attended separately and merged = attended together.
    one = np.array([0, 7], np.int32)
    full_out, full_lse = fp8mla.prefill_attention(q[:7], k[:7], v[:7], one, one, 7, 7,
                                                  softmax_scale=scale, causal=False,
                                                  return_lse=True)
    parts = [fp8mla.prefill_attention(q[:7], k[lo:hi], v[lo:hi], one,
                                      np.array([0, hi - lo], np.int32), 7, hi - lo,
                                      softmax_scale=scale, causal=False, return_lse=True)
             for lo, hi in ((0, 3), (3, 7))]
    o, lse = fp8mla.merge_attention_states(parts[0][0], parts[0][1], parts[1][0], parts[1][1])
    np.testing.assert_allclose(lse, full_lse, atol=1e-5)
    np.testing.assert_allclose(o.astype(np.float32), full_out.astype(np.float32), atol=1e-2)


def test_merge_reads_positive_infinity_as_an_empty_state():
    """FlashAttention-3 writes lse +inf for a row without keys: merged as an empty state."""
    rng = np.random.default_rng(5)
    o_a = rng.standard_normal((3, 2, 128)).astype(np.float32)
    o_b = rng.standard_normal((3, 2, 128)).astype(np.float32)
    lse_a = np.array([[np.inf, 0.5], [np.inf, -np.inf], [1.0, np.inf]], np.float32)
    lse_b = np.array([[0.25, np.inf], [np.inf, np.inf], [2.0, -1.0]], np.float32)
    o, lse = fp8mla.merge_attention_states(o_a, lse_a, o_b, lse_b)
    np.testing.assert_array_equal(o[0, 0], o_b[0, 0])
    np.testing.assert_array_equal(o[0, 1], o_a[0, 1])
    assert lse[0, 0] == lse_b[0, 0] and lse[0, 1] == lse_a[0, 1]
    assert np.all(o[1] == 0) and np.all(lse[1] == -np.inf)
    np.testing.assert_array_equal(o[2, 1], o_b[2, 1])
    assert not np.isnan(o).any() and not np.isnan(lse).any()


def test_errors_are_clear():
    q, k, v, cu_q, cu_k = ragged([4], [4], 1, BF16, 3)
    with pytest.raises(fp8mla.InvalidArgumentError, match="max_seqlen_q"):
        fp8mla.prefill_attention(q, k, v, cu_q, cu_k, 2, 4, softmax_scale=0.1)
    with pytest.raises(fp8mla.InvalidArgumentError, match="q_descale"):
        fp8mla.prefill_attention(q.astype(np.float32).astype(E4M3), k.astype(np.float32).astype(E4M3),
                                 v.astype(np.float32).astype(E4M3), cu_q, cu_k, 4, 4,
                                 softmax_scale=0.1)


def test_numpy_prior_state_folds_like_the_merge():
    """prior_out / prior_lse: the call's own state merged into the prior one, the bytes of the
    call followed by merge_attention_states; in place when they are out and lse; an empty prior
    state leaves the call's own bytes; two key halves folded = attended together."""
    q, k, v, cu_q, cu_k = ragged([7, 30], [9, 30], 2, BF16, 6)
    rng = np.random.default_rng(9)
    prior_out = rng.uniform(-2, 2, (37, 2, DV)).astype(np.float32).astype(BF16)
    prior_lse = rng.uniform(-1, 5, (37, 2)).astype(np.float32)
    prior_lse[3, 1], prior_lse[20, 0] = -np.inf, np.inf
    call = dict(softmax_scale=0.1, causal=False, return_lse=True)
    own_out, own_lse = fp8mla.prefill_attention(q, k, v, cu_q, cu_k, 30, 30, **call)
    want_out, want_lse = fp8mla.merge_attention_states(prior_out, prior_lse, own_out, own_lse)
    out, lse = fp8mla.prefill_attention(q, k, v, cu_q, cu_k, 30, 30, prior_out=prior_out,
                                        prior_lse=prior_lse, **call)
    np.testing.assert_array_equal(out.view(np.uint16), want_out.view(np.uint16))
    np.testing.assert_array_equal(lse, want_lse)
    state, state_lse = prior_out.copy(), prior_lse.copy()
    fp8mla.prefill_attention(q, k, v, cu_q, cu_k, 30, 30, out=state, lse=state_lse,
                             prior_out=state, prior_lse=state_lse, **call)
    np.testing.assert_array_equal(state.view(np.uint16), want_out.view(np.uint16))
    np.testing.assert_array_equal(state_lse, want_lse)
    empty = np.full_like(prior_lse, -np.inf)
    out, lse = fp8mla.prefill_attention(q, k, v, cu_q, cu_k, 30, 30, prior_out=prior_out,
                                        prior_lse=empty, **call)
    np.testing.assert_array_equal(out.view(np.uint16), own_out.view(np.uint16))
    np.testing.assert_array_equal(lse, own_lse)
    # Keys of one sequence in two chunks, the second folded into the first.
    one = np.array([0, 7], np.int32)
    full_out, full_lse = fp8mla.prefill_attention(q[:7], k[:9], v[:9], one,
                                                  np.array([0, 9], np.int32), 7, 9, **call)
    first = fp8mla.prefill_attention(q[:7], k[:4], v[:4], one, np.array([0, 4], np.int32), 7, 4,
                                     **call)
    both = fp8mla.prefill_attention(q[:7], k[4:9], v[4:9], one, np.array([0, 5], np.int32), 7, 5,
                                    prior_out=first[0], prior_lse=first[1], **call)
    np.testing.assert_allclose(both[1], full_lse, atol=1e-5)
    np.testing.assert_allclose(both[0].astype(np.float32), full_out.astype(np.float32), atol=2e-2)
    with pytest.raises(fp8mla.InvalidArgumentError, match="`prior_out` and `prior_lse` together"):
        fp8mla.prefill_attention(q, k, v, cu_q, cu_k, 30, 30, prior_out=prior_out, **call)
