"""The torch.compile pass of fp8mla.torch_fusion: functions calling prefill_attention or
merge_attention_states and then a standalone quantization of the bf16 output are compiled with
the pass (Inductor, on CPU tensors and on CUDA ones where present); the graph after the pass has
the fused attention call and no quantization node, the pass reports the fusion, and the compiled
outputs and scales are the eager (unfused) bytes and strides. Graphs the pass must not fuse
compile unfused and still match eager. Skipped (visibly) without torch."""

from __future__ import annotations

import operator

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import torch._dynamo  # noqa: E402
import torch._inductor.config  # noqa: E402
from torch._higher_order_ops.auto_functionalize import (  # noqa: E402
    auto_functionalized,
    auto_functionalized_v2,
)
from torch._inductor.custom_graph_pass import CustomGraphPass  # noqa: E402
from torch_helpers import assert_identical, needs_gpu  # noqa: E402

import fp8mla  # noqa: E402
from fp8mla.torch_fusion import Fusion, OutputQuantFusionPass  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=needs_gpu)]
H, D = 4, 128
W = H * D


class Inputs:
    """A ragged causal batch of `tokens` queries (its first rows see no key) and bf16 merge
    states with -inf LSEs, on `device`."""

    def __init__(self, device, tokens=10, states=torch.bfloat16):
        g = torch.Generator().manual_seed(5)
        self.tokens = tokens
        self.q = ((torch.rand(tokens, H, 192, generator=g) * 2 - 1).to(torch.bfloat16)
                  .to(device))
        self.v = ((torch.rand(tokens, H, D, generator=g) * 8 - 4).to(torch.bfloat16)
                  .to(device))
        self.cu_q = torch.tensor([0, 4, tokens], dtype=torch.int32, device=device)
        self.cu_k = torch.tensor([0, 2, tokens - 2], dtype=torch.int32, device=device)
        lse = torch.where(torch.arange(tokens * H).view(tokens, H) % 3 == 0, -torch.inf, 0.5)
        self.lse = lse.to(device)
        self.states = self.v.to(states)
        self.scale = torch.full((1,), 150.0, device=device)
        self.global_scale = torch.full((1,), 500.0, device=device)

    def attend(self, op, **kwargs):
        if op == "prefill_attention":
            k, v = self.q[:-2], self.v[:-2]
            longest = self.tokens - 4
            return fp8mla.prefill_attention(self.q, k, v, self.cu_q, self.cu_k, longest, longest,
                                            softmax_scale=0.1, **kwargs)
        return fp8mla.merge_attention_states(self.states, self.lse, self.states.flip(0),
                                             self.lse.flip(0), **kwargs)[0]


class Recorder(CustomGraphPass):
    """Runs the fusion pass and records the fp8mla calls of the graph after it."""

    def __init__(self):
        self.fusion = OutputQuantFusionPass()
        self.calls = []

    def __call__(self, graph):
        self.fusion(graph)
        for node in graph.nodes:
            if node.target in (auto_functionalized, auto_functionalized_v2):
                self.calls.append((node.args[0].name().partition("::")[2], quantized(node)))

    def uuid(self):
        return None  # no Inductor cache: every compile runs the pass


def quantized(node) -> bool:
    """Whether an attention call writes a quantized output (its scales given)."""
    kwargs = node.kwargs
    block = kwargs.get("output_block_scale", kwargs.get("_output_block_scale_base_index"))
    return kwargs.get("output_scale") is not None or block is not None


def compile_and_run(fn, *args, v2=True, dynamic=False):
    """(fn(*args) compiled with the pass, the Recorder)."""
    torch._dynamo.reset()
    recorder = Recorder()
    options = {"post_grad_custom_post_pass": recorder, "enable_auto_functionalized_v2": v2}
    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic, options=options)
    return compiled(*args), recorder


def assert_same_results(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert_identical(a, b)


def _group(group, layout, given_bytes=False):
    def quant(x, o):
        # UE8M0 scales allocated by the op (float8_e8m0fnu) or given as their uint8 bytes.
        scales = (torch.empty(x.tokens, W // group, dtype=torch.uint8, device=o.device)
                  if given_bytes else None)
        return fp8mla.quantize_fp8_per_token_group(o.view(x.tokens, -1), group_size=group,
                                                   scales=scales, scale_layout=layout)
    return (f"group{group}-{layout}{'-bytes' if given_bytes else ''}", quant,
            "quantize_fp8_per_token_group", f"fp8_group{group}", layout)


def _nvfp4(layout):
    def quant(x, o):
        return fp8mla.quantize_nvfp4(o.reshape(x.tokens, -1), x.global_scale, layout=layout)
    return f"nvfp4-{layout}", quant, "quantize_nvfp4", "nvfp4", layout


# (id, quant(inputs, bf16 output) -> results, the standalone op, key, scale layout)
CASES = [
    ("static-value", lambda x, o: (fp8mla.quantize_fp8(o, 150.0),), "quantize_fp8",
     "fp8_static", None),
    ("static-tensor", lambda x, o: (fp8mla.quantize_fp8(o.view(x.tokens, W), x.scale),),
     "quantize_fp8_scale_tensor", "fp8_static", None),
    *(_group(group, layout) for group in (128, 64)
      for layout in ("row_major", "column_major", "tma_aligned", "ue8m0", "packed_ue8m0")),
    _group(128, "ue8m0", given_bytes=True),
    _nvfp4("swizzled"),
    _nvfp4("linear"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["prefill_attention", "merge_attention_states"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fuses(case, op, device):
    _, quant, quant_op, key, layout = case
    x = Inputs(device)

    def fn():
        return quant(x, x.attend(op))

    got, recorder = compile_and_run(fn)
    assert recorder.fusion.fused == [Fusion(op, quant_op, key, layout)]
    assert recorder.fusion.skipped == []
    assert recorder.calls == [(op, True)]  # the fused attention, no quantization node
    assert_same_results(got, fn())


@pytest.mark.parametrize("v2", [True, False], ids=["auto_functionalized_v2",
                                                   "auto_functionalized"])
@pytest.mark.parametrize("device", DEVICES)
def test_fuses_beside_lse_and_chunked_merges(device, v2):
    """Attention returning its LSE (still read after the fusion), two chunks merged, the last
    merge quantized: that merge fuses, the attention calls and the first merge stay bf16."""
    x = Inputs(device)

    def fn():
        o, lse = x.attend("prefill_attention", return_lse=True)
        prefix, prefix_lse = x.attend("prefill_attention", causal=False, return_lse=True)
        merged, merged_lse = fp8mla.merge_attention_states(o, lse, prefix, prefix_lse)
        o2, lse2 = fp8mla.merge_attention_states(merged, merged_lse, o, lse)
        out, scales = fp8mla.quantize_fp8_per_token_group(o2.view(x.tokens, W),
                                                          scale_layout="tma_aligned")
        fused, fused_lse = x.attend("prefill_attention", return_lse=True)
        static = fp8mla.quantize_fp8(fused, 150.0)
        return out, scales, lse2, static, fused_lse + 1

    got, recorder = compile_and_run(fn, v2=v2)
    assert recorder.fusion.fused == [
        Fusion("merge_attention_states", "quantize_fp8_per_token_group", "fp8_group128",
               "tma_aligned"),
        Fusion("prefill_attention", "quantize_fp8", "fp8_static", None)]
    assert sorted(recorder.calls) == [
        ("merge_attention_states", False), ("merge_attention_states", True),
        ("prefill_attention", False), ("prefill_attention", False), ("prefill_attention", True)]
    assert_same_results(got, fn())


@pytest.mark.parametrize("v2", [True, False], ids=["auto_functionalized_v2",
                                                   "auto_functionalized"])
@pytest.mark.parametrize("device", DEVICES)
def test_fuses_a_folding_chunk_call(device, v2):
    """The last prefix chunk's call folding the running state (prior_out / prior_lse), then the
    group quantization of its output: one call writing the o_proj input (the layer's last
    chunk); the extend call stays bf16. On CUDA the folding kernel is non-causal."""
    x = Inputs(device)

    def fn():
        o, lse = x.attend("prefill_attention", return_lse=True)
        folded = x.attend("prefill_attention", causal=False, prior_out=o, prior_lse=lse)
        return fp8mla.quantize_fp8_per_token_group(folded.view(x.tokens, W),
                                                   scale_layout="tma_aligned")

    got, recorder = compile_and_run(fn, v2=v2)
    assert recorder.fusion.fused == [Fusion("prefill_attention", "quantize_fp8_per_token_group",
                                            "fp8_group128", "tma_aligned")]
    assert sorted(recorder.calls) == [("prefill_attention", False), ("prefill_attention", True)]
    assert_same_results(got, fn())


@pytest.mark.parametrize("device", DEVICES)
def test_fuses_dynamic_token_count(device):
    """torch.compile(dynamic=True): the token count is symbolic."""
    def fn(x):
        o = x.attend("prefill_attention")
        return (*fp8mla.quantize_fp8_per_token_group(o.view(x.tokens, W), group_size=64,
                                                     scale_layout="packed_ue8m0"),
                *fp8mla.quantize_nvfp4(x.attend("merge_attention_states").view(x.tokens, W),
                                       x.global_scale))

    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True,
                             options={"post_grad_custom_post_pass": recorder})
    for tokens in (10, 37):
        x = Inputs(device, tokens)
        assert_same_results(compiled(x), fn(x))
    assert {f.key for f in recorder.fusion.fused} == {"fp8_group64", "nvfp4"}
    assert recorder.calls and all(fused for _, fused in recorder.calls)


@pytest.mark.parametrize("device", DEVICES)
def test_fuses_into_given_buffers(device):
    """An engine's way: the quantized outputs and scales are the function's arguments, written
    in place (the compiled graph copies into them)."""
    x = Inputs(device)

    def fn(out, scales, fp4, block):
        fp8mla.quantize_fp8_per_token_group(x.attend("prefill_attention").view(x.tokens, W),
                                            out=out, scales=scales)
        fp8mla.quantize_nvfp4(x.attend("merge_attention_states").view(x.tokens, W),
                              x.global_scale, out=fp4, block_scales=block)

    def buffers():
        return (torch.empty(x.tokens, W, dtype=torch.float8_e4m3fn, device=device),
                torch.empty(W // 128, 12, device=device)[:, :x.tokens].t(),
                torch.empty(x.tokens, W // 2, dtype=torch.uint8, device=device),
                torch.zeros(128, W // 16, dtype=torch.uint8, device=device))

    got, want = buffers(), buffers()
    _, recorder = compile_and_run(fn, *got)
    fn(*want)
    assert [f.key for f in recorder.fusion.fused] == ["fp8_group128", "nvfp4"]
    assert recorder.calls == [("prefill_attention", True), ("merge_attention_states", True)]
    assert_same_results(got, want)


def _uses_out_twice(x):
    o = x.attend("prefill_attention")
    return (*fp8mla.quantize_fp8_per_token_group(o.view(x.tokens, W)), o)


def _quantizes_q(x):
    x.attend("prefill_attention")  # the attention's output is dropped
    return fp8mla.quantize_fp8_per_token_group(x.q[..., :D].reshape(x.tokens, -1))


def _quantizes_a_sum(x):
    return fp8mla.quantize_fp8_per_token_group((x.attend("prefill_attention") * 2).view(
        x.tokens, W))


def _scale_from_lse(x):
    o, lse = x.attend("prefill_attention", return_lse=True)
    scale = lse.nan_to_num(neginf=0.0).amax().reshape(1) + 100
    return fp8mla.quantize_fp8(o, scale), lse


# (id, fn(inputs) -> results, inputs' keyword arguments, the reason reported (None: not a
# candidate at all))
UNFUSED = [
    ("bf16-also-returned", _uses_out_twice, {}, "the bf16 output has other uses"),
    ("quant-of-q", _quantizes_q, {}, None),
    ("quant-of-a-product", _quantizes_a_sum, {}, None),
    ("f32-merge-states", lambda x: fp8mla.quantize_fp8_per_token_group(
        x.attend("merge_attention_states").view(x.tokens, W)), {"states": torch.float32},
     "the attention output is torch.float32 [10, 4, 128], not bf16 [T, H, D]"),
    ("other-eps", lambda x: fp8mla.quantize_fp8_per_token_group(
        x.attend("prefill_attention").view(x.tokens, W), eps=1e-6), {},
     "eps 1e-06 (the fused quantization uses 1e-10)"),
    ("pow2-f32-scales", lambda x: fp8mla.quantize_fp8_per_token_group(
        x.attend("prefill_attention").view(x.tokens, W), round_scale_to_pow2=True), {},
     "f32 scales rounded to powers of two"),
    ("rows-per-head", lambda x: fp8mla.quantize_fp8_per_token_group(
        x.attend("prefill_attention")), {},
     "the quantized rows are not the tokens (input not [T, H * D])"),
    ("scale-from-lse", _scale_from_lse, {},
     "the quantization's other inputs depend on the attention"),
    ("e5m2", lambda x: (fp8mla.quantize_fp8(x.attend("prefill_attention"), 2.0, dtype="e5m2"),),
     {}, "the output is not e4m3"),
    ("linear-whole-tiles", lambda x: fp8mla.quantize_nvfp4(
        x.attend("prefill_attention").view(x.tokens, W), x.global_scale, layout="linear"),
     {"tokens": 128}, "linear block scales that may have the swizzled shape"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", UNFUSED, ids=[c[0] for c in UNFUSED])
def test_runs_unfused(case, device):
    _, fn, inputs, reason = case
    x = Inputs(device, **inputs)
    got, recorder = compile_and_run(fn, x)
    assert recorder.fusion.fused == []
    assert [s.reason for s in recorder.fusion.skipped] == ([reason] if reason else [])
    assert not any(fused for _, fused in recorder.calls)
    assert any(name.startswith("quantize") for name, _ in recorder.calls)
    assert_same_results(got, fn(x))


def test_reachable_as_an_attribute_after_import_fp8mla():
    """fp8mla.torch_fusion.OutputQuantFusionPass() as the user guide writes it, in a process
    that imported only fp8mla (the submodule loads on first use)."""
    import os
    import subprocess
    import sys

    code = ("import fp8mla; p = fp8mla.torch_fusion.OutputQuantFusionPass(); "
            "print(type(p).__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "OutputQuantFusionPass"


def test_enable():
    config = torch._inductor.config
    with config.patch(post_grad_custom_post_pass=None, fx_graph_cache=False):
        installed = fp8mla.enable_output_quant_fusion()
        assert config.post_grad_custom_post_pass is installed
        assert fp8mla.enable_output_quant_fusion() is installed
        x = Inputs("cpu")

        def fn():
            return fp8mla.quantize_nvfp4(x.attend("prefill_attention").view(x.tokens, W),
                                         x.global_scale)

        torch._dynamo.reset()
        got = torch.compile(fn, fullgraph=True)()
        assert installed.fused == [Fusion("prefill_attention", "quantize_nvfp4", "nvfp4",
                                          "swizzled")]
        assert_same_results(got, fn())
    with config.patch(post_grad_custom_post_pass=Recorder()):
        with pytest.raises(RuntimeError, match="already"):
            fp8mla.enable_output_quant_fusion()


def test_a_graph_without_fp8mla_ops():
    graph = torch.fx.symbolic_trace(lambda a: operator.add(a, 1)).graph
    fusion = OutputQuantFusionPass()
    fusion(graph)
    assert fusion.fused == [] and fusion.skipped == []
