"""What an entry of the op table (_ops.py) is made of, and the code built from it.

An Op lists its arguments (Arg) in the C++ API's order. From it, once at import, come
  - the public function: its signature (positional arguments in order, then the keyword-only
    ones), the Python-side checks, the allocation of missing outputs, the coercion of scalars,
    the call of the adapter and the result;
  - c_args: the arguments of _C.<op> from the torch op's (tensors converted by the adapter's
    `tensor`, the DTYPE argument left out, YaRN as _C's tuple);
  - the torch schema (torch_ops.py).
Both functions are written out as straight-line Python (no per-call loop over the arguments) and
registered with linecache, so a traceback shows their lines; print Op.public_source to read one.

Kinds:
    TENSOR, OPT_TENSOR        an input tensor (OPT_: may be None)
    OUT                       an output, allocated by its `alloc` rule when not given (with a
                              `when` rule: only when that holds; otherwise it may stay None);
                              an op's outputs all missing are allocated together where the
                              adapter `groups()` (the rules run on _arrays.Plan, the adapter's
                              empty_group allocates)
    INOUT, OPT_INOUT          a tensor the op writes into that the caller always provides
    SCALE                     a float or a one-element f32 tensor (the torch op gets a twin
                              `<op>_scale_tensor` taking the tensor)
    SCALAR_TENSOR, OPT_SCALAR_TENSOR
                              a one-element f32 tensor; a number becomes one on the op's device
    FLOAT, INT, BOOL, STR     scalars (STR: an enum of the C++ API, checked by the binding)
    OPT_INT                   None or an integer
    YARN                      None or a YaRN dict (see make_cos_sin_cache), six numbers for C++
    DTYPE                     an fp8 output format ("e4m3" / "e5m2"), checked here, not passed
                              to the C++ op (it names the output's dtype)
    PY                        used by the Python layer only (allocation), not passed on
`dtype` of a tensor argument names its fp8mla dtype: what an output is allocated as and what a
plain unsigned array given for it holds (uint8 bytes of e4m3, uint16 bits of bf16). Rules
(`alloc`, `when`, `dtype` when callable, an op's `check`, `choose` and `result`) are functions
whose parameter names are argument names (`arrays` first: the adapter).

A query (Op(..., query=True)) reads its tensors' metadata only and returns what _C returns: it
has no outputs, no `stream` and no `result` rule, and it is not a torch custom op (it puts
nothing in a graph: torch_ops.py leaves it out).
"""

from __future__ import annotations

import inspect
import linecache

from ._arrays import Plan
from ._common import FP8_DTYPES, as_int, check_choice, yarn_list, yarn_tuple

TENSOR, OPT_TENSOR, OUT, INOUT, OPT_INOUT = "tensor", "tensor?", "out", "inout", "inout?"
SCALE, SCALAR_TENSOR, OPT_SCALAR_TENSOR = "scale", "scalar_tensor", "scalar_tensor?"
FLOAT, INT, BOOL, STR, YARN, DTYPE, PY = "float", "int", "bool", "str", "yarn", "dtype", "py"
OPT_INT = "int?"

TENSOR_KINDS = (TENSOR, OPT_TENSOR, OUT, INOUT, OPT_INOUT, SCALAR_TENSOR, OPT_SCALAR_TENSOR)
MUTATED_KINDS = (OUT, INOUT, OPT_INOUT)
OPTIONAL_KINDS = (OPT_TENSOR, OPT_INOUT, OPT_SCALAR_TENSOR)
_REQUIRED = object()


class Arg:
    """One argument of an op: its C++ name, kind, default and (outputs) how it is allocated."""

    def __init__(self, name, kind, default=_REQUIRED, *, keyword=None, public=None, dtype=None,
                 alloc=None, when=None):
        self.name = name                          # C++ / torch schema name
        self.public = public or name              # its name in the public Python function
        self.kind = kind
        self.default = None if kind == OUT and default is _REQUIRED else default
        self.keyword = (self.default is not _REQUIRED) if keyword is None else keyword
        self.dtype = dtype
        self.alloc = alloc
        self.when = when
        self.optional = kind in OPTIONAL_KINDS or when is not None  # may stay None


class Op:
    """One op: its arguments in C++ order, docstring, rules, and the code generated from them."""

    def __init__(self, name, doc, args, *, result=None, check=None, choose=None, host_fill=False,
                 query=False):
        self.name = name
        self.query = query
        self.__doc__ = doc
        self.args = tuple(args)
        # What the torch op and _C take: the Python-only arguments left out.
        self.schema_args = tuple(a for a in self.args if a.kind != PY)
        self.mutates = tuple(a.name for a in self.args if a.kind in MUTATED_KINDS)
        # The first tensor picks the adapter, the device of allocations and the stream.
        self.first_tensor = next(a for a in self.args if a.kind in TENSOR_KINDS)
        self.scale = next((i for i, a in enumerate(self.schema_args) if a.kind == SCALE), None)
        # The C++ op fills CUDA memory by a blocking copy outside the stream (set-up work).
        self.host_fill = host_fill
        self._rules = {}  # rule functions by the unique names the generated code calls them by
        self.public_source = self._public_source(result, check, choose)
        self.c_args_source = self._c_args_source()
        self.c_args = self.compile("c_args", self.c_args_source)

    def public_function(self, adapter_for):
        """The public function of this op; adapter_for(x) gives the adapter of array x."""
        function = self.compile(self.name, self.public_source, _adapter_for=adapter_for)
        function.__doc__ = self.__doc__
        return function

    # ---- code generation ----

    def rule(self, fn, label: str, arrays: str = "arrays") -> str:
        """Source text calling rule `fn` (kept as _<label>) with the arguments it names (its
        `arrays`, the adapter, as the expression `arrays`)."""
        self._rules[f"_{label}"] = fn
        names = [arrays if p == "arrays" else p for p in inspect.signature(fn).parameters]
        return f"_{label}({', '.join(names)})"

    def _public_source(self, result, check, choose) -> str:
        def param(a):
            return a.public if a.default is _REQUIRED else f"{a.public}={a.default!r}"

        positional = [param(a) for a in self.args if not a.keyword]
        keyword = [param(a) for a in self.args if a.keyword]
        if not self.query:
            keyword.append("stream=None")
        params = positional + (["*"] + keyword if keyword else [])
        lines = [f"def {self.name}({', '.join(params)}):"]
        if choose is not None:
            lines.append(f"    arrays = {self.rule(choose, 'choose')}")
        else:
            lines.append(f"    arrays = _adapter_for({self.first_tensor.public})")
        for a in self.args:
            if a.kind == DTYPE:
                lines.append(f"    if {a.public} not in _FP8_DTYPES:")
                lines.append(f"        _check_choice({self.name!r}, {a.public!r}, {a.public}, "
                             f"_FP8_DTYPES)")
        if check is not None:
            lines.append(f"    {self.rule(check, 'check')}")
        outputs = [a for a in self.args if a.kind == OUT]
        if outputs:
            missing = {a.public: f"{a.public} is None" + (
                f" and {self.rule(a.when, 'when_' + a.name)}" if a.when else "") for a in outputs}
            any_missing = " or ".join(f"({m})" if len(missing) > 1 else m for m in missing.values())
            lines.append(f"    if {any_missing}:")
            flags = ", ".join(f"{name}={m}" for name, m in missing.items())
            lines.append(f"        arrays.require({self.name!r}, {flags})")
            indent = "        "
            if len(outputs) > 1:
                # Every output missing (the usual call) and an adapter that can: the rules say
                # what they would allocate and the adapter allocates them together.
                every_missing = " and ".join(f"({m})" for m in missing.values())
                names = ", ".join(a.public for a in outputs)
                specs = "".join(
                    self.rule(a.alloc, "alloc_" + a.name, arrays="_Plan") + ", " for a in outputs)
                lines.append(f"        if {every_missing} and arrays.groups():")
                lines.append(f"            {names} = arrays.empty_group(({specs}))")
                lines.append("        else:")
                indent += "    "
            for a in outputs:
                lines.append(f"{indent}if {missing[a.public]}:")
                lines.append(f"{indent}    {a.public} = {self.rule(a.alloc, 'alloc_' + a.name)}")
        values = ", ".join(self._schema_value(a) for a in self.schema_args)
        if self.query:
            lines.append(f"    return arrays.query(_op, ({values},))")
            return "\n".join(lines) + "\n"
        lines.append(f"    arrays.call(_op, ({values},), stream or 0)")
        lines.append(f"    return {self.rule(result, 'result')}")
        return "\n".join(lines) + "\n"

    def _schema_value(self, a) -> str:
        """The expression of argument `a` as the torch op and c_args take it."""
        v, first = a.public, self.first_tensor.public
        if a.kind == INT:
            # A torch.SymInt (torch.compile's symbolic value) passes as it is: int() would fix the
            # graph to one value.
            return f"({v} if {v}.__class__ is int else _as_int({v}))"
        if a.kind in (FLOAT, BOOL):
            # Converted only where not of that type already: each conversion is a call.
            return f"({v} if {v}.__class__ is {a.kind} else {a.kind}({v}))"
        if a.kind == OPT_INT:
            return f"(None if {v} is None else int({v}))"
        if a.kind == SCALE:
            # A Python float, the common case, passes as it is without the adapter's test.
            return f"({v} if {v}.__class__ is float or arrays.is_array({v}) else float({v}))"
        if a.kind == SCALAR_TENSOR:
            return f"({v} if arrays.is_array({v}) else arrays.scalar(float({v}), {first}))"
        if a.kind == OPT_SCALAR_TENSOR:
            return (f"({v} if {v} is None or arrays.is_array({v}) "
                    f"else arrays.scalar(float({v}), {first}))")
        if a.kind == YARN:
            theta = next((t.public for t in self.args if t.name == "theta"), None)
            return f"_yarn_list({self.name!r}, {v}, {theta})"
        return v

    def c_values(self, tensor_expr) -> list:
        """The expressions of _C's arguments from the torch op's parameters (the DTYPE argument
        left out, YaRN as _C's tuple); tensor_expr(name, raw) gives a tensor's, where `raw` is the
        expression of the fp8mla dtype it names ("None" when the table names none); a SCALE that
        is a float passes as it is."""
        items = []
        for a in self.schema_args:
            if a.kind == DTYPE:
                continue
            raw = self.rule(a.dtype, "raw_" + a.name) if callable(a.dtype) else repr(a.dtype)
            if a.kind in TENSOR_KINDS:
                item = tensor_expr(a.name, raw)
                items.append(f"(None if {a.name} is None else {item})"
                             if a.optional and item != a.name else item)
            elif a.kind == SCALE:
                item = tensor_expr(a.name, "None")
                items.append(item if item == a.name
                             else f"({a.name} if {a.name}.__class__ is float else {item})")
            elif a.kind == YARN:
                items.append(f"_yarn_tuple({a.name})")
            else:
                items.append(a.name)
        return items

    def _c_args_source(self) -> str:
        items = self.c_values(lambda name, raw: f"tensor({name}, {raw})")
        params = ", ".join(["tensor"] + [a.name for a in self.schema_args])
        body = ",\n            ".join(items)
        return f"def c_args({params}):\n    return ({body},)\n"

    def compile(self, name, source, **extra):
        """Function `name` of `source`, compiled with the op's rules and `extra` in scope."""
        filename = f"<fp8mla._ops {self.name}.{name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace = {"_op": self, "_check_choice": check_choice, "_FP8_DTYPES": FP8_DTYPES,
                     "_as_int": as_int,
                     "_Plan": Plan,
                     "_yarn_list": yarn_list, "_yarn_tuple": yarn_tuple, **self._rules, **extra}
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - built from the table
        return namespace[name]
