"""float64 attention on float arrays, the reference of the attention tests."""

from __future__ import annotations

import numpy as np


def reference(q, k, v, cu_q, cu_k, scale, causal):
    """float64 attention on float arrays [T, H, D]: (out [Tq, H, Dv], lse [Tq, H])."""
    tq, heads = q.shape[0], q.shape[1]
    out = np.zeros((tq, heads, v.shape[2]))
    lse = np.full((tq, heads), -np.inf)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        for i in range(q1 - q0):
            visible = min(k1 - k0, max(0, i + (k1 - k0) - (q1 - q0) + 1)) if causal else k1 - k0
            if visible == 0:
                continue
            s = np.einsum("hd,jhd->hj", q[q0 + i], k[k0:k0 + visible]) * scale
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            out[q0 + i] = np.einsum("hj,jhd->hd", p / p.sum(axis=1, keepdims=True),
                                    v[k0:k0 + visible])
            lse[q0 + i] = (m[:, 0] + np.log(p.sum(axis=1)))
    return out, lse
