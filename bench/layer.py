#!/usr/bin/env python3
"""The MLA layer from Python, against what an engine runs without fp8mla: the Python twin of
`fp8mla bench layer`, every row timed in this one process on the same shapes (a single sequence
of T new tokens, T = 2k, 8k, 32k, with no prefix or a cached prefix of T tokens), in interleaved
rounds (each round times every row once, in turn; a row's figure is the median of its rounds).
bench/report.py --kind layer puts it beside the C++ run.

Rows (DeepSeek-V3 dims, random weights):
- fp8: `fp8mla.MlaLayer` with FP8 block-scaled weights and the "fp8-hopper" backend (the FP8
  path), through `prefill` on a host batch (prefixes up to 8192 keys one-shot, as the C++ bench);
- bf16: a second MlaLayer of the same weights with "bf16-hopper" (the BF16 path, the same FP8
  GEMMs);
- engine: what an engine on Hopper runs today for this layer (the layer issue's "engine" row,
  SGLang's DeepSeek prefill in its MHA form): the same FP8 block-scaled GEMMs (cuBLASLt through
  torch's scaled_mm; q_a_proj and kv_a_proj as one GEMM), activations quantized per 1 x 128 group
  by fp8mla's quantize_fp8_per_token_group (a bandwidth-bound kernel, so this row is not slowed by
  a weaker stand-in), RMSNorm and RoPE torch.compile'd, RoPE written into q in place, K assembled
  by slice copies, the e4m3 latent cache write in torch, the prefix rows gathered and dequantized
  for kv_b_proj, and FlashAttention-3's bf16 varlen forward (the `fa3-fwd` wheel; bottom-right
  causal over [prefix | new] keys);
- eager: the same layer in eager PyTorch, bf16 weights and GEMMs, cuDNN SDPA.
YaRN as DeepSeek-V3 configures it only changes the RoPE tables and the softmax scale; the torch
rows use plain tables, which cost the same.

    python3 bench/layer.py --json out/layer_py.json [--tokens 2048 8192] [--rounds 3]
    python3 bench/report.py --kind layer --cli out/layer_cli.json --py out/layer_py.json

Timer: bench/common.py's time_ms, queued (the calls of a row run back to back behind a sleep
kernel, so host time enters only where the host falls behind the device), each row's timed calls
led by ~--settle-ms of its own untimed ones, the rows' order rotated every round.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics

from common import load_fa3, time_ms

HIDDEN, HEADS, Q_LORA, KV_LORA, ROPE, NOPE, DV = 7168, 128, 1536, 512, 64, 128, 128
TOKENS = [2048, 8192, 32768]
PAGE = 64
TIMER = "CUDA events around each call, median of iters, queued (bench/common.py time_ms); " \
        "median over interleaved rounds"


def rope_interleaved(torch, x, cos, sin):
    """RoPE on interleaved pairs (2i, 2i + 1); cos, sin: [T, 32], broadcast over heads."""
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x0, x1 = x.float()[..., 0::2], x.float()[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2).to(x.dtype)


def rms_norm(torch, x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class EagerMlaLayer:
    """DeepSeek-V3's MLA attention layer in eager PyTorch, bf16."""

    def __init__(self, torch, device):
        self.torch = torch
        g = torch.Generator(device=device).manual_seed(1)

        def linear(out, inp):
            w = (torch.rand(out, inp, device=device, generator=g) * 2 - 1) / math.sqrt(inp)
            return w.to(torch.bfloat16)

        self.q_a = linear(Q_LORA, HIDDEN)
        self.q_b = linear(HEADS * (NOPE + ROPE), Q_LORA)
        self.kv_a = linear(KV_LORA + ROPE, HIDDEN)
        self.kv_b = linear(HEADS * (NOPE + DV), KV_LORA)
        self.o = linear(HIDDEN, HEADS * DV)
        self.q_norm = torch.ones(Q_LORA, device=device, dtype=torch.bfloat16)
        self.kv_norm = torch.ones(KV_LORA, device=device, dtype=torch.bfloat16)
        pos = torch.arange(65536, device=device, dtype=torch.float32)
        inv = 1.0 / (10000.0 ** (torch.arange(0, ROPE, 2, device=device, dtype=torch.float32) / ROPE))
        freqs = torch.outer(pos, inv)
        self.cos, self.sin = freqs.cos(), freqs.sin()
        self.scale = 1.0 / math.sqrt(NOPE + ROPE)

    def linear(self, x, name):
        return x @ getattr(self, name).t()

    def norm(self, x, w):
        return rms_norm(self.torch, x, w)

    def rope(self, x, positions):
        return rope_interleaved(self.torch, x, self.cos[positions], self.sin[positions])

    def forward(self, hidden, cache, prefix_slots, slots, positions):
        torch = self.torch
        T = hidden.shape[0]
        q = self.linear(self.norm(self.linear(hidden, "q_a"), self.q_norm), "q_b").view(T, HEADS, -1)
        q_nope, q_pe = q.split([NOPE, ROPE], dim=-1)
        latent = self.linear(hidden, "kv_a")
        kv_c = self.norm(latent[:, :KV_LORA], self.kv_norm)
        k_pe = self.rope(latent[:, KV_LORA:], positions)
        q = torch.cat((q_nope, self.rope(q_pe, positions)), dim=-1)
        kv_c, k_pe = self.cache_rows(cache, kv_c, k_pe, slots, prefix_slots)
        n = kv_c.shape[0]
        kv = self.linear(kv_c, "kv_b").view(n, HEADS, NOPE + DV)
        k_nope, v = kv.split([NOPE, DV], dim=-1)
        k = torch.cat((k_nope, k_pe.unsqueeze(1).expand(n, HEADS, ROPE)), dim=-1)
        o = self.attention(q, k, v)
        return self.linear(o.reshape(T, HEADS * DV), "o")

    def cache_rows(self, cache, kv_c, k_pe, slots, prefix_slots):
        """Writes the new rows' e4m3 [kv_c | k_pe] to their slots; returns (kv_c, k_pe) of the
        prefix rows (gathered and dequantized) followed by the new ones."""
        torch = self.torch
        flat = cache.view(torch.uint8).view(-1, KV_LORA + ROPE)  # fp8 bytes: index_put on u8
        flat[slots] = torch.cat((kv_c, k_pe), dim=-1).to(torch.float8_e4m3fn).view(torch.uint8)
        if prefix_slots.numel() == 0:
            return kv_c, k_pe
        old = flat[prefix_slots].view(torch.float8_e4m3fn).to(torch.bfloat16)
        return torch.cat((old[:, :KV_LORA], kv_c)), torch.cat((old[:, KV_LORA:], k_pe))

    def attention(self, q, k, v):
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        if qh.shape[2] == kh.shape[2]:
            kwargs = {"is_causal": True}
        else:
            kwargs = {"attn_mask": causal_lower_right(qh.shape[2], kh.shape[2])}
        sdpa = torch.nn.functional.scaled_dot_product_attention
        # cuDNN first (the attention anchor); PyTorch's own choice where cuDNN declines the mask.
        for backends in ([SDPBackend.CUDNN_ATTENTION], None):
            try:
                if backends is None:
                    o = sdpa(qh, kh, vh, scale=self.scale, **kwargs)
                else:
                    with sdpa_kernel(backends):
                        o = sdpa(qh, kh, vh, scale=self.scale, **kwargs)
                self.attention_backend = "cudnn" if backends else "pytorch default"
                break
            except RuntimeError:
                if backends is None:
                    raise
        return o.squeeze(0).transpose(0, 1)


class EngineFp8Layer(EagerMlaLayer):
    """The layer as an engine on Hopper runs it without fp8mla (SGLang's DeepSeek prefill, MHA
    form): q_a_proj and kv_a_proj as one GEMM, every projection an FP8 block-scaled GEMM (e4m3
    weights with a scale per 128 x 128 block, activations quantized per 1 x 128 group), RMSNorm
    and RoPE torch.compile'd, RoPE written into q in place, K assembled from its two parts by
    slice copies, FA3's bf16 attention. The activation quantization is fp8mla's own
    quantize_fp8_per_token_group (a bandwidth-bound kernel, as engines ship one), so that this
    row is not slowed by a weaker stand-in."""

    def __init__(self, torch, device, fp8mla, fa3):
        super().__init__(torch, device)
        self.fa3, self.fp8mla = fa3, fp8mla
        compile_ = lambda f: torch.compile(f, dynamic=True)  # noqa: E731 - one graph per op
        self.norm_compiled = compile_(lambda x, w: rms_norm(torch, x, w))
        self.rope_compiled = compile_(lambda x, c, s: rope_interleaved(torch, x, c, s))
        self.qkv_a = torch.cat((self.q_a, self.kv_a))  # [1536 + 576, hidden]
        self.weights = {name: self.quantize_weight(getattr(self, name))
                        for name in ("qkv_a", "q_b", "kv_b", "o")}
        self.scaled_mm = self.pick_scaled_mm()
        self.cu_seqlens = {}
        self.notes = {}

    def quantize_weight(self, w, rows=None):
        """(e4m3 [rows, K], f32 [rows / 128, K / 128], N): one scale per 128 x 128 block, amax /
        448, the weight's N rows padded with zeros to `rows` (default: N rounded up to whole
        blocks, the last block partial)."""
        torch = self.torch
        N, K = w.shape
        Np = -(-N // 128) * 128
        blocks = torch.nn.functional.pad(w.float(), (0, 0, 0, Np - N)).view(Np // 128, 128,
                                                                            K // 128, 128)
        s = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / 448.0
        q = (blocks / s[:, None, :, None]).to(torch.float8_e4m3fn).view(Np, K)
        return q[:rows or N].contiguous(), s.contiguous(), N

    def pick_scaled_mm(self):
        """torch's blockwise FP8 GEMM (cuBLASLt): the scaled_mm API where torch has it, else
        _scaled_mm, which infers the block scaling from the scales' shapes."""
        torch = self.torch
        F = torch.nn.functional
        if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
            def mm(a, a_s, w, w_s):
                return F.scaled_mm(a, w.t(), a_s, F.ScalingType.BlockWise1x128, w_s.t(),
                                   F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)
            return mm

        def mm_v1(a, a_s, w, w_s):
            return torch._scaled_mm(a, w.t(), scale_a=a_s, scale_b=w_s.t(),
                                    out_dtype=torch.bfloat16)
        return mm_v1

    def linear(self, x, name):
        torch = self.torch
        w, w_s, n = self.weights[name]
        M = x.shape[0]
        if M % 4:  # cuBLASLt's 1 x 128 scales want the row count a multiple of 4
            x = torch.nn.functional.pad(x, (0, 0, 0, 4 - M % 4))
        # Scales column-major (strides (1, M)): the outer-dim-major layout cuBLASLt reads.
        a, a_s = self.fp8mla.quantize_fp8_per_token_group(x, scale_layout="column_major")
        y = self.scaled_mm(a, a_s, w, w_s)
        return y[:M] if y.shape[1] == n else y[:M, :n]

    def check_gemm(self):
        """The blockwise GEMM computes the dequantized product (cosine >= 0.999), or raise;
        qkv_a's N = 2112, a partial last weight block, runs or is padded to whole blocks."""
        torch = self.torch
        x = torch.randn(256, KV_LORA, device=self.cos.device, dtype=torch.bfloat16)
        w, w_s, _ = self.weights["kv_b"]
        ref = x.float() @ (w.float().view(w.shape[0] // 128, 128, -1, 128) *
                           w_s[:, None, :, None]).view(w.shape).t()
        got = self.linear(x, "kv_b").float()
        try:
            self.linear(torch.randn(8, HIDDEN, device=x.device, dtype=x.dtype), "qkv_a")
        except RuntimeError as e:
            n = self.qkv_a.shape[0]
            self.weights["qkv_a"] = self.quantize_weight(self.qkv_a, -(-n // 128) * 128)[:2] + (n,)
            self.notes["qkv_a"] = f"weight padded to whole blocks ({str(e).splitlines()[0][:120]})"
        cos = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0).item()
        if not cos >= 0.999:
            raise RuntimeError(f"engine row: blockwise scaled_mm disagrees with its reference "
                               f"(cosine {cos:.5f})")
        return cos

    def norm(self, x, w):
        return self.norm_compiled(x, w)

    def rope(self, x, positions):
        return self.rope_compiled(x, self.cos[positions], self.sin[positions])

    def queries_and_latent(self, hidden, positions):
        """(q [T, H, 192] with RoPE, kv_c [T, 512] normalized, k_pe [T, 64] with RoPE)."""
        T = hidden.shape[0]
        qkv_a = self.linear(hidden, "qkv_a")
        q = self.linear(self.norm(qkv_a[:, :Q_LORA], self.q_norm), "q_b").view(T, HEADS, -1)
        q[..., NOPE:] = self.rope(q[..., NOPE:], positions)
        kv_c = self.norm(qkv_a[:, Q_LORA:Q_LORA + KV_LORA], self.kv_norm)
        k_pe = self.rope(qkv_a[:, Q_LORA + KV_LORA:], positions)
        return q, kv_c, k_pe

    def keys_values(self, kv_c, k_pe):
        """(K [n, H, 192] assembled by slice copies, V [n, H, 128] a view of kv_b's output)."""
        n = kv_c.shape[0]
        kv = self.linear(kv_c, "kv_b").view(n, HEADS, NOPE + DV)
        k = self.torch.empty(n, HEADS, NOPE + ROPE, device=kv.device, dtype=kv.dtype)
        k[..., :NOPE] = kv[..., :NOPE]
        k[..., NOPE:] = k_pe.unsqueeze(1)
        return k, kv[..., NOPE:]

    def forward(self, hidden, cache, prefix_slots, slots, positions):
        q, kv_c, k_pe = self.queries_and_latent(hidden, positions)
        kv_c, k_pe = self.cache_rows(cache, kv_c, k_pe, slots, prefix_slots)
        k, v = self.keys_values(kv_c, k_pe)
        o = self.attention(q, k, v)
        return self.linear(o.reshape(hidden.shape[0], HEADS * DV), "o")

    def attention(self, q, k, v):
        torch = self.torch
        Tq, Tk = q.shape[0], k.shape[0]
        if (Tq, Tk) not in self.cu_seqlens:  # an engine keeps its batch metadata on the device
            self.cu_seqlens[Tq, Tk] = tuple(torch.tensor([0, n], device=q.device, dtype=torch.int32)
                                            for n in (Tq, Tk))
        cu_q, cu_k = self.cu_seqlens[Tq, Tk]
        out, *_ = self.fa3._flash_attn_forward(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                               max_seqlen_q=Tq, max_seqlen_k=Tk,
                                               softmax_scale=self.scale, causal=True)
        self.attention_backend = "fa3 bf16"
        return out


class Fp8mlaLayerRow:
    """fp8mla.MlaLayer's prefill of one sequence on a host batch, its workspace and out given."""

    def __init__(self, fp8mla, torch, layer, hidden, cache, prefix, T):
        self.layer, self.hidden, self.cache = layer, hidden, cache
        self.batch = [fp8mla.MlaSequence(prefix, T, list(range(prefix + T)))]
        self.out = torch.empty(T, HIDDEN, device=hidden.device, dtype=torch.bfloat16)
        nbytes = layer.workspace_bytes(T, 1, prefix)
        self.workspace = torch.empty(nbytes, device=hidden.device, dtype=torch.uint8)

    def __call__(self):
        self.layer.prefill(self.hidden, self.batch, self.cache, out=self.out,
                           workspace=self.workspace)


def rows_for_shape(torch, fp8mla, layers, T, prefix):
    """{row: callable} for one shape; each row writes its own copy of the cache."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(7)
    hidden = torch.randn(T, HIDDEN, device=dev, dtype=torch.bfloat16, generator=g)
    pages = (prefix + T + PAGE - 1) // PAGE
    cache = torch.randn(pages, PAGE, KV_LORA + ROPE, device=dev, generator=g)
    cache = cache.to(torch.float8_e4m3fn)
    prefix_slots = torch.arange(prefix, device=dev)
    slots = torch.arange(prefix, prefix + T, device=dev)
    positions = slots.clone()
    rows = {}
    for name, layer in layers.items():
        own = cache.clone()
        if isinstance(layer, EagerMlaLayer):
            rows[name] = (lambda lay=layer, c=own: lay.forward(hidden, c, prefix_slots, slots,
                                                               positions))
        else:
            rows[name] = Fp8mlaLayerRow(fp8mla, torch, layer, hidden, own, prefix, T)
    return rows


def time_rows(torch, calls, args):
    """({row: ms of each round}, {row: error}): args.rounds rounds, each row once a round in an
    order rotated every round, each timing led by ~args.settle_ms of its own calls untimed (so it
    runs in its own steady state under the power cap, not in the transient the row before left:
    bench/analysis/attention-power-order-2026-12-03.md)."""
    times = {name: [] for name in calls}
    errors, estimates = {}, {}

    def attempt(name, timing):
        try:
            return timing()
        except Exception as e:  # noqa: BLE001 - a row's failure is reported
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            return None

    for name, fn in calls.items():
        estimates[name] = attempt(name, lambda fn=fn: time_ms(torch, fn, 1, warmup=1))
    names = [n for n in calls if n not in errors]
    for rnd in range(args.rounds):
        shift = rnd % max(len(names), 1)
        for name in names[shift:] + names[:shift]:
            if name in errors:
                continue
            lead = math.ceil(args.settle_ms / max(estimates[name], 1e-3))
            ms = attempt(name, lambda fn=calls[name]: time_ms(torch, fn, args.iters, args.warmup,
                                                               lead=lead))
            if ms is not None:
                times[name].append(ms)
    return times, errors


def run(args):
    import torch

    import fp8mla

    dev = torch.device("cuda")
    fa3, fa3_note = load_fa3()
    weights = fp8mla.generate_mla_weights("deepseek-v3", "fp8", 3)
    layers = {"fp8": fp8mla.MlaLayer(None, weights, "cuda", backend="fp8-hopper"),
              "bf16": fp8mla.MlaLayer(None, weights, "cuda", backend="bf16-hopper")}
    notes = {"fa3": fa3_note}
    if fa3 is not None:
        try:
            engine = EngineFp8Layer(torch, dev, fp8mla, fa3)
            notes["engine_gemm_cosine"] = engine.check_gemm()
            notes.update(engine.notes)
            layers["engine"] = engine
        except Exception as e:  # noqa: BLE001 - the row is left out and says why
            notes["engine_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    layers["eager"] = EagerMlaLayer(torch, dev)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} fp8mla "
          f"{fp8mla.__version__}; {notes}", flush=True)
    rows = []
    for T in args.tokens:
        for prefix in (0, T):
            try:
                calls = rows_for_shape(torch, fp8mla, layers, T, prefix)
            except torch.OutOfMemoryError as e:
                rows.append({"path": "all", "tokens": T, "prefix": prefix,
                             "error": str(e).splitlines()[0][:200]})
                continue
            times, errors = time_rows(torch, calls, args)
            for name in calls:
                row = {"path": name, "tokens": T, "prefix": prefix}
                if name in errors:
                    row["error"] = errors[name]
                else:
                    row["ms"] = statistics.median(times[name])
                    row["rounds_ms"] = times[name]
                if isinstance(layers[name], EagerMlaLayer):
                    row["attention_backend"] = getattr(layers[name], "attention_backend", None)
                rows.append(row)
            line = "  ".join(f"{r['path']} {r['ms']:8.3f}" if "ms" in r else
                             f"{r['path']} error" for r in rows[-len(calls):])
            print(f"T={T:6d} prefix={prefix:6d}  {line} ms", flush=True)
            del calls
            torch.cuda.empty_cache()
    doc = {"bench": "layer", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": datetime.date.today().isoformat(),
           "timer": f"{TIMER}; each row led by {args.settle_ms:g} ms of its untimed calls, "
                    "the order rotated every round", "rounds": args.rounds,
           "notes": notes, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape")
    p.add_argument("--settle-ms", type=float, default=300.0,
                   help="untimed calls of a row right before its timed ones, in ms (0: none)")
    p.add_argument("--json", help="write the timings here")
    run(p.parse_args())


if __name__ == "__main__":
    main()
