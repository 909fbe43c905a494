"""The torch.compile pass that fuses the quantization of an attention output into the attention
op (docs/design.md section 6).

It rewrites torch.ops.fp8mla.prefill_attention or merge_attention_states with a bf16 `out`
whose only use is fp8mla's standalone quantization (quantize_fp8 with an e4m3 output,
quantize_fp8_per_token_group, quantize_nvfp4) into one call of the same attention op that
writes the quantized output and its scales itself (`out`, `output_scale`,
`output_block_scale`): the bytes the unfused pair gives, so the compiled function's results do
not change. Any other graph is left as it is and runs unfused.

Turn it on with fp8mla.enable_output_quant_fusion() (which installs it as
torch._inductor.config.post_grad_custom_post_pass) or per compile:
    torch.compile(fn, options={"post_grad_custom_post_pass": OutputQuantFusionPass()})
The pass's `fused` lists what it fused, `skipped` the candidates it left and why.

It is a walk over the post-grad FX graph rather than pattern_matcher patterns: after
functionalization each call of a mutating op is an auto_functionalized (or, by default,
auto_functionalized_v2) node whose mutated arguments are bases plus per-call view metadata
(sizes, strides, offsets), and the scale layout lives in exactly that metadata. A pattern
would have to be traced per key, layout and functionalization form and could not rebuild the
view metadata of the replacement; the walk reads it from the matched nodes and moves it onto
the fused node, for both forms.
"""

from __future__ import annotations

import logging
import operator
from typing import NamedTuple

import torch
import torch._inductor.config
from torch._higher_order_ops.auto_functionalize import auto_functionalized, auto_functionalized_v2
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch._inductor.pattern_matcher import stable_topological_sort
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import torch_ops  # noqa: F401 - registers torch.ops.fp8mla

_log = logging.getLogger(__name__)
_aten = torch.ops.aten

_ATTENTION_OPS = ("prefill_attention", "merge_attention_states")
# Quantization op -> (its global/static scale argument, its block scale argument).
_QUANT_OPS = {"quantize_fp8": ("scale_inv", None),
              "quantize_fp8_scale_tensor": ("scale_inv", None),
              "quantize_fp8_per_token_group": (None, "scales"),
              "quantize_nvfp4": ("global_scale", "block_scales")}
# Ops between the attention output and the quantization's input that keep its values in order.
_RESHAPES = (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default,
             _aten.alias.default)
# auto_functionalized_v2's per-argument view metadata: kwargs "_<argument>_<suffix>".
_VIEW_SUFFIXES = ("base_index", "size", "stride", "storage_offset", "slice_dim", "slice_start",
                  "slice_end", "alias")
_EPS = 1e-10  # the eps of the fused group quantization


class Fusion(NamedTuple):
    attention: str          # "prefill_attention" or "merge_attention_states"
    quant: str              # the standalone op it replaced
    key: str                # the output quantization key (fp8mla.detect_output_quant_key)
    scale_layout: str | None  # row_major, column_major, tma_aligned, ue8m0, packed_ue8m0,
                            # strided (other f32 strides), swizzled, linear; None for static


class Skipped(NamedTuple):
    attention: str
    quant: str
    reason: str


class _Call:
    """A functionalized call of an fp8mla op: its arguments, and where its mutated arguments
    (outputs) come from and go to, in either functionalization form."""

    def __init__(self, node: torch.fx.Node):
        self.node = node
        self.op = node.args[0]
        self.name = self.op.name().partition("::")[2]
        self.v2 = node.target is auto_functionalized_v2
        self.mutated = [a.name for a in self.op._schema.arguments
                        if a.alias_info is not None and a.alias_info.is_write]

    def __getitem__(self, name):
        return self.node.kwargs[name]

    def base_index(self, name):
        """v2: the index of the argument's base in _all_bases (None: not given)."""
        return self.node.kwargs[f"_{name}_base_index"]

    def output_index(self, name):
        """The getitem index of the argument's new value (None: not given)."""
        if not self.v2:
            return 1 + self.mutated.index(name) if self.node.kwargs[name] is not None else None
        index = self.base_index(name)
        return None if index is None else 1 + index

    def argument_node(self, name):
        """The node whose value the argument is, or is a view of (v2: its base)."""
        if not self.v2:
            return self.node.kwargs[name]
        index = self.base_index(name)
        return None if index is None else self.node.kwargs["_all_bases"][index]

    def value(self, name):
        """The fake tensor the op sees for a mutated argument (v2: its view regenerated)."""
        base = self.argument_node(name)
        if base is None:
            return None
        if not self.v2:
            return base.meta["val"]
        # Sizes are nodes where they are symbolic: read their values.
        kwargs = torch.fx.node.map_arg(self.node.kwargs, lambda n: n.meta["val"])
        base = base.meta["val"]
        if f"_{name}_storage_offset" in kwargs:
            return base.as_strided(kwargs[f"_{name}_size"], kwargs[f"_{name}_stride"],
                                   kwargs[f"_{name}_storage_offset"])
        if f"_{name}_slice_dim" in kwargs:
            return _aten.slice.Tensor(base, kwargs[f"_{name}_slice_dim"],
                                      kwargs[f"_{name}_slice_start"],
                                      kwargs[f"_{name}_slice_end"])
        return base

    def view_kwargs(self, name, as_name, base_index):
        """v2: the argument's view metadata renamed for argument `as_name` of another call."""
        kwargs = {f"_{as_name}_{s}": self.node.kwargs[f"_{name}_{s}"] for s in _VIEW_SUFFIXES
                  if f"_{name}_{s}" in self.node.kwargs}
        kwargs[f"_{as_name}_base_index"] = base_index
        return kwargs

    def getitems(self):
        """The getitem nodes reading this call's outputs."""
        return [u for u in self.node.users if u.target is operator.getitem]


def _fp8mla_call(node: torch.fx.Node, names) -> _Call | None:
    if node.op != "call_function" or node.target not in (auto_functionalized,
                                                         auto_functionalized_v2):
        return None
    op = node.args[0]
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "fp8mla":
        return None
    call = _Call(node)
    return call if call.name in names else None


def _known(condition) -> bool:
    """True where `condition` holds for every value of the graph's symbolic sizes."""
    return statically_known_true(condition)


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(_known(x == y) for x, y in zip(a, b))


def _source(quant: _Call):
    """(attention, the nodes from its `out` getitem to the quantization's input) where the
    input is an attention op's output through reshapes only, else None."""
    node, chain = quant["x"], []
    while isinstance(node, torch.fx.Node) and node.target in _RESHAPES:
        chain.append(node)
        node = node.args[0]
    if not isinstance(node, torch.fx.Node) or node.target is not operator.getitem:
        return None
    attention = _fp8mla_call(node.args[0], _ATTENTION_OPS)
    if attention is None or attention.v2 != quant.v2 or node.args[1] != attention.output_index(
            "out"):
        return None
    return attention, [node, *reversed(chain)]


def _out_fits(out, tokens, heads) -> bool:
    """`out` as the fused op takes it: [T, W] or [T, H, D], a token's values contiguous."""
    if out.dim() == 2:
        return _known(out.shape[0] == tokens) and _known(out.stride(1) == 1)
    return (out.dim() == 3 and _known(out.shape[0] == tokens) and _known(out.shape[1] == heads)
            and _known(out.stride(2) == 1) and _known(out.stride(1) == out.shape[2]))


class _Unfusable(Exception):
    """A pair the pass leaves unfused; the message says why."""


def _group_layout(scales, width):
    """The scale layout of quantize_fp8_per_token_group's scales."""
    rows = scales.shape[0]
    if scales.dtype == torch.int32:
        if width <= 256:  # either group size packs into these words: the fused op rejects them
            raise _Unfusable("packed UE8M0 scales for W <= 256 are ambiguous")
        return "packed_ue8m0"
    if scales.dtype != torch.float32:
        return "ue8m0"
    if _known(scales.stride(1) == 1):
        return "row_major"
    if _known(scales.stride(0) == 1) and _known(scales.stride(1) == rows):
        return "column_major"
    if _known(scales.stride(0) == 1) and _known(scales.stride(1) == (rows + 3) // 4 * 4):
        return "tma_aligned"
    return "strided"


def _nvfp4_layout(quant: _Call, out):
    """The block scale layout of quantize_nvfp4."""
    block = quant.value("block_scales")
    if block.dtype != torch.float8_e4m3fn and not (block.dtype == out.dtype == torch.uint8):
        raise _Unfusable("the block scales are neither float8_e4m3fn nor raw bytes with a uint8 "
                         "output")
    if quant["layout"] != "linear":
        return quant["layout"]
    # The fused op reads a contiguous 2-d tensor of whole 128-row tiles as swizzled.
    if block.dim() == 2 and _known(block.stride(1) == 1) and _known(
            block.stride(0) == block.shape[1]) and not _known(block.shape[0] % 128 != 0):
        raise _Unfusable("linear block scales that may have the swizzled shape")
    return "linear"


def _depends_on(nodes, target: torch.fx.Node) -> bool:
    seen, todo = set(), list(nodes)
    while todo:
        node = todo.pop()
        if node is target:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(node.all_input_nodes)
    return False


def _match(attention: _Call, quant: _Call, chain):
    """(key, scale layout) of the fusion of `quant` into `attention`; raises _Unfusable.
    `chain`: the nodes from the attention's `out` getitem to the quantization's input."""
    if any(len(node.users) != 1 for node in chain):
        raise _Unfusable("the bf16 output has other uses")
    others = [n for n in quant.node.all_input_nodes if n is not quant["x"]]
    if _depends_on(others, attention.node):
        raise _Unfusable("the quantization's other inputs depend on the attention")
    o = attention.value("out")
    if o.dtype != torch.bfloat16 or o.dim() != 3:
        raise _Unfusable(f"the attention output is {o.dtype} {list(o.shape)}, not bf16 [T, H, D]")
    if attention["stream"] != quant["stream"]:
        raise _Unfusable("the ops run on different streams")
    tokens, width = o.shape[0], o.shape[1] * o.shape[2]
    out, x = quant.value("out"), quant["x"].meta["val"]
    if not _out_fits(out, tokens, o.shape[1]):
        raise _Unfusable("the quantized output is not [T, H * D] or [T, H, D] with contiguous "
                         "rows")
    if quant.name in ("quantize_fp8", "quantize_fp8_scale_tensor"):
        if quant["dtype"] != "e4m3":
            raise _Unfusable("the output is not e4m3")
        return "fp8_static", None
    if not _same_shape(x.shape, (tokens, width)):
        raise _Unfusable("the quantized rows are not the tokens (input not [T, H * D])")
    if quant.name == "quantize_nvfp4":
        return "nvfp4", _nvfp4_layout(quant, out)
    layout = _group_layout(quant.value("scales"), width)
    if quant["eps"] != _EPS:
        raise _Unfusable(f"eps {quant['eps']} (the fused quantization uses {_EPS})")
    if quant["round_scale_to_pow2"] and layout not in ("ue8m0", "packed_ue8m0"):
        raise _Unfusable("f32 scales rounded to powers of two")
    return f"fp8_group{quant['group_size']}", layout


def _fused_kwargs(attention: _Call, quant: _Call, scale):
    """The attention call's kwargs with the quantization's output, scales and block scales, and
    the getitem indices of the two calls' outputs on the fused call ({call node: {old: new}})."""
    block = _QUANT_OPS[quant.name][1]
    moved = {"out": "out"} | ({block: "output_block_scale"} if block else {})
    kwargs = dict(attention.node.kwargs, output_scale=scale)
    remap = {attention.node: {0: 0}, quant.node: {0: 0}}  # 0: the op's own result, None
    if not attention.v2:
        for name, as_name in moved.items():
            kwargs[as_name] = quant[name]
            remap[quant.node][quant.output_index(name)] = 1 + attention.mutated.index(as_name)
        remap[attention.node] = {i: i for i in range(1 + len(attention.mutated))}
        return kwargs, remap
    bases = []

    def place(node):
        if node not in bases:
            bases.append(node)
        return bases.index(node)

    for name in ("out", "output_block_scale"):
        kwargs = {k: v for k, v in kwargs.items()
                  if k not in {f"_{name}_{s}" for s in _VIEW_SUFFIXES}}
        kwargs[f"_{name}_base_index"] = None
    for name in attention.mutated:
        index = attention.base_index(name)
        if name not in ("out", "output_block_scale") and index is not None:
            kwargs[f"_{name}_base_index"] = place(attention.argument_node(name))
            remap[attention.node][1 + index] = 1 + kwargs[f"_{name}_base_index"]
    for name, as_name in moved.items():
        new_index = place(quant.argument_node(name))
        kwargs.update(quant.view_kwargs(name, as_name, new_index))
        remap[quant.node][quant.output_index(name)] = 1 + new_index
    kwargs["_all_bases"] = bases
    return kwargs, remap


def _new_node(graph, like, target, args, kwargs, sources=()):
    """A new node with its fake value (what later passes read), computed in the fake mode of
    `like` (a fake tensor of the graph); with `sources` (the nodes it replaces), their metadata
    and the eager-mode values of their inputs (Inductor's eager_input_vals: eager strides)."""
    node = graph.call_function(target, args, kwargs)
    eager = {}
    for source in sources:
        node.meta.update({k: v for k, v in source.meta.items() if k != "eager_input_vals"})
        if "eager_input_vals" in source.meta:
            torch.utils._pytree.tree_map(lambda n, v: eager.setdefault(n, v) if isinstance(
                n, torch.fx.Node) else None, (source.args, source.kwargs),
                source.meta["eager_input_vals"])
    if eager:
        node.meta["eager_input_vals"] = torch.fx.node.map_arg(
            (args, kwargs), lambda n: eager.get(n, n.meta["val"]))
    args, kwargs = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
    with like.fake_mode:
        node.meta["val"] = target(*args, **kwargs)
    return node


def _fuse(graph, attention: _Call, quant: _Call, chain):
    """Replaces the two calls by one fused call; `chain`: the nodes from the attention's `out`
    getitem to the quantization's input, which only they use."""
    scale_name = _QUANT_OPS[quant.name][0]
    scale = quant[scale_name] if scale_name else None
    o = attention.value("out")
    with graph.inserting_before(quant.node):
        if isinstance(scale, float):  # quantize_fp8's scale by value: a one-element tensor
            scale = _new_node(graph, o, _aten.full.default, ([1], scale),
                              {"dtype": torch.float32, "device": o.device, "pin_memory": False})
        kwargs, remap = _fused_kwargs(attention, quant, scale)
        fused = _new_node(graph, o, attention.node.target, (attention.op,), kwargs,
                          (quant.node, attention.node))
    for call in (attention, quant):
        for getitem in call.getitems():
            if getitem is not chain[0]:
                getitem.args = (fused, remap[call.node][getitem.args[1]])
    out_base = attention.argument_node("out")
    for node in (quant.node, *reversed(chain), attention.node):
        graph.erase_node(node)
    if not out_base.users and out_base.target in (_aten.empty.memory_format,
                                                  _aten.empty_strided.default):
        graph.erase_node(out_base)


class OutputQuantFusionPass(CustomGraphPass):
    """The pass (a torch._inductor post-grad custom pass). `fused` lists each Fusion it made,
    `skipped` each attention output it found quantized but left unfused (Skipped, with the
    reason), over every graph it ran on; clear them to start over. A graph Inductor loads from
    its FX graph cache does not run the pass again: its fusions were reported when it was
    compiled (torch._inductor.config.fx_graph_cache = False reports them on every compile)."""

    def __init__(self):
        self.fused: list[Fusion] = []
        self.skipped: list[Skipped] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        changed = False
        for node in list(graph.nodes):
            quant = _fp8mla_call(node, _QUANT_OPS)
            source = _source(quant) if quant is not None else None
            if source is None:
                continue
            attention, chain = source
            try:
                match = _match(attention, quant, chain)
            except _Unfusable as why:
                self.skipped.append(Skipped(attention.name, quant.name, str(why)))
                _log.info("fp8mla: not fused: %s -> %s: %s", attention.name, quant.name, why)
                continue
            _fuse(graph, attention, quant, chain)
            self.fused.append(Fusion(attention.name, quant.name, *match))
            _log.info("fp8mla: fused %s -> %s (%s, %s)", attention.name, quant.name, *match)
            changed = True
        if changed:
            stable_topological_sort(graph)  # users of the attention's lse now follow the fusion

    def uuid(self):
        return get_hash_for_files((__file__,))


def enable_output_quant_fusion() -> OutputQuantFusionPass:
    """Installs the pass as torch._inductor.config.post_grad_custom_post_pass (for every later
    torch.compile with the inductor backend) and returns it; returns the installed one when it
    already is. Another custom post pass installed there is an error: run this one from it."""
    config = torch._inductor.config
    current = config.post_grad_custom_post_pass
    if isinstance(current, OutputQuantFusionPass):
        return current
    if current is not None:
        raise RuntimeError(f"torch._inductor.config.post_grad_custom_post_pass is already "
                           f"{current!r}: call an fp8mla.torch_fusion.OutputQuantFusionPass() "
                           f"from it on the graph instead")
    config.post_grad_custom_post_pass = OutputQuantFusionPass()
    return config.post_grad_custom_post_pass
