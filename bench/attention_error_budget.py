#!/usr/bin/env python3
"""Where the FP8 attention's error comes from, at the statistics of the DeepSeek-V3 preset's
generated weights: 1 - cosine of attention outputs against float64 when only Q, only K, only V,
only P, or all four go through e4m3 (unit scales, P scaled by 2^8 before its cast as the kernel
does), and when Q, K, V are bf16. q, k and v are N(0, 1/3) (a projection with U(-1, 1) / sqrt(in)
weights of a unit-RMS input), softmax scale mscale^2 / sqrt(192) (YaRN, factor 40), causal.

    python3 bench/attention_error_budget.py   # numpy and ml_dtypes, ~20 s on two cores
"""
import math

import ml_dtypes
import numpy as np

T, DQK, DV, HEADS = 1024, 192, 128, 8
SCALE = (0.1 * math.log(40) + 1) ** 2 / math.sqrt(DQK)


def rounded(x, dtype):
    return x.astype(dtype).astype(np.float64)


def attention(q, k, v, fp8_p=False):
    s = np.einsum("hqd,hkd->hqk", q, k) * SCALE
    s[:, np.triu(np.ones((T, T), bool), 1)] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    if fp8_p:
        p = rounded(p * 256.0, ml_dtypes.float8_e4m3fn)  # O / sum(P) cancels the 2^8
    return np.einsum("hqk,hkd->hqd", p, v) / p.sum(-1, keepdims=True)


def main():
    rng = np.random.default_rng(0)
    sigma = 1 / math.sqrt(3)
    q, k = (rng.normal(0, sigma, (HEADS, T, DQK)) for _ in range(2))
    v = rng.normal(0, sigma, (HEADS, T, DV))
    e4m3 = lambda x: rounded(x, ml_dtypes.float8_e4m3fn)  # noqa: E731
    bf16 = lambda x: rounded(x, ml_dtypes.bfloat16)  # noqa: E731
    ref = attention(q, k, v).ravel()
    cases = {
        "e4m3 Q": attention(e4m3(q), k, v),
        "e4m3 K": attention(q, e4m3(k), v),
        "e4m3 V": attention(q, k, e4m3(v)),
        "e4m3 P": attention(q, k, v, fp8_p=True),
        "e4m3 Q, K, V, P": attention(e4m3(q), e4m3(k), e4m3(v), fp8_p=True),
        "bf16 Q, K, V": attention(bf16(q), bf16(k), bf16(v)),
    }
    print("| rounded | relative RMS error | 1 - cosine |\n|---|---:|---:|")
    for name, out in cases.items():
        o = out.ravel()
        err = np.linalg.norm(o - ref) / np.linalg.norm(ref)
        cos = o @ ref / (np.linalg.norm(o) * np.linalg.norm(ref))
        print(f"| {name} | {err:.4f} | {1 - cos:.2e} |")


if __name__ == "__main__":
    main()
