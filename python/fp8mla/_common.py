"""Helpers of the op table (_ops.py): errors, output shapes, scale layouts, YaRN arguments."""

from __future__ import annotations

import math
import operator

from . import _C

SCALE_LAYOUTS = ("row_major", "column_major", "tma_aligned", "ue8m0", "packed_ue8m0")
FP8_DTYPES = ("e4m3", "e5m2")


def invalid_argument(message: str) -> Exception:
    """An fp8mla.InvalidArgumentError raised by the Python layer (same class as the C++ ones)."""
    error = _C.InvalidArgumentError(f"fp8mla invalid-argument error: {message}")
    error.category = "invalid-argument"
    error.message = message
    return error


def check_choice(op: str, name: str, value, choices) -> None:
    if value not in choices:
        raise invalid_argument(f"{op}: expected {name} one of {choices}, got {value!r}")


def round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def folded_rows(shape) -> int:
    """Rows of an N-d tensor seen as rows of its last dim (a 0-d tensor is one row)."""
    rows = 1
    for size in shape[:-1]:  # a loop, not math.prod: sizes may be torch SymInts under compile
        rows = rows * size
    return rows


def group_scale_plan(shape, group_size: int, layout: str):
    """(kind, storage_shape, transpose, rows) for the scales of quantize_fp8_per_token_group.

    kind is 'f32', 'ue8m0' or 'i32'. The scales are `empty(storage_shape)`, then, when
    `transpose`, `[:, :rows].T` (column-major views with strides (1, storage_shape[1])).
    """
    rows = folded_rows(shape)
    cols = shape[-1] if len(shape) else 1
    groups = cols // group_size if group_size > 0 else 0
    if layout == "row_major":
        return "f32", (rows, groups), False, rows
    if layout == "column_major":
        return "f32", (groups, rows), True, rows
    if layout == "tma_aligned":
        return "f32", (groups, round_up(rows, 4)), True, rows
    if layout == "ue8m0":
        return "ue8m0", (rows, groups), False, rows
    # packed_ue8m0: 4 exponent bytes per int32 along the groups, TMA-aligned column-major.
    return "i32", ((groups + 3) // 4, round_up(rows, 4)), True, rows


def nvfp4_shapes(shape, layout: str):
    """(out_shape, block_scales_shape) of quantize_nvfp4 for an input of `shape`."""
    rows = folded_rows(shape)
    cols = shape[-1] if len(shape) else 1
    out_shape = tuple(shape[:-1]) + (cols // 2,)
    blocks = cols // 16
    if layout == "swizzled":
        return out_shape, (round_up(rows, 128), round_up(blocks, 4))
    return out_shape, (rows, blocks)


def as_int(value):
    """`value` as an int, or as it is where it is a torch.SymInt (a value torch.compile keeps
    symbolic; int() would fix the compiled graph to the value it has now)."""
    return value if type(value).__name__ == "SymInt" else int(value)


# ---- MLA prefill preparation ---------------------------------------------------------------------

MLA = _C.MLA_DIMS  # nope 128, rope 64, qk 192, v 128, kv_lora_rank 512, latent 576
YARN_KEYS = ("factor", "original_max_position", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim")
# Hugging Face's spelling of a key (rope_scaling, and transformers 5's rope_parameters), the keys
# naming the RoPE type, and rope_parameters' keys that fp8mla's YaRN fixes rather than reads.
_YARN_ALIASES = {"original_max_position_embeddings": "original_max_position"}
_YARN_TYPE_KEYS = ("type", "rope_type")
_YARN_FIXED_KEYS = ("rope_theta", "attention_factor", "truncate", "partial_rotary_factor")


# A dict's missing mscale keys are absent, as transformers reads a config (YarnScaling's 0); its
# other missing keys take DeepSeek-V3's values (_C.YARN_DEFAULTS).
_YARN_ABSENT = {"mscale": 0.0, "mscale_all_dim": 0.0}


def _check_fixed_yarn_keys(op: str, fixed: dict, values: dict, theta) -> None:
    """rope_parameters' keys whose value fp8mla's YaRN does not take but computes or fixes: each
    must agree with it (a differing one is an error, never ignored)."""
    def expect(key, want, what):
        if key in fixed and fixed[key] != want:
            raise invalid_argument(f"{op}: yarn[{key!r}]: expected {want!r} ({what}), "
                                   f"got {fixed[key]!r}")
    if "rope_theta" in fixed and theta is not None and float(fixed["rope_theta"]) != float(theta):
        raise invalid_argument(
            f"{op}: yarn['rope_theta'] is {fixed['rope_theta']!r} but theta is {theta!r}: pass "
            f"theta={fixed['rope_theta']!r} (the table's base is theta; the dict's is checked)")
    expect("truncate", True, "the correction range is rounded to whole dims, as DeepSeek does")
    if "partial_rotary_factor" in fixed and float(fixed["partial_rotary_factor"]) != 1.0:
        raise invalid_argument(f"{op}: yarn['partial_rotary_factor']: expected 1.0 (rope_dim "
                               f"gives the rotated dims), got {fixed['partial_rotary_factor']!r}")
    if fixed.get("attention_factor") is not None:
        want = _C.yarn_attention_factor(float(values["factor"]), float(values["mscale"]),
                                        float(values["mscale_all_dim"]))
        if not math.isclose(float(fixed["attention_factor"]), want, rel_tol=1e-12):
            raise invalid_argument(
                f"{op}: yarn['attention_factor']: expected {want!r} (what the table applies: "
                f"mscale(factor, mscale) / mscale(factor, mscale_all_dim), or mscale(factor, 1) "
                f"where either is absent or 0), got {fixed['attention_factor']!r}")


def yarn_list(op: str, yarn, theta=None):
    """None, or the six numbers of a YaRN dict (missing keys: DeepSeek-V3's values, but a missing
    mscale or mscale_all_dim is absent, 0, as transformers reads a config) as floats, in
    YarnScaling's order (what the torch op takes; yarn_tuple makes _C's tuple of them).

    Accepts a model config's dict as it is: rope_scaling (original_max_position_embeddings, type
    / rope_type "yarn") and transformers 5's rope_parameters, which also hold rope_theta (must
    equal `theta`, where the op has one), attention_factor (must be the mscale ratio the table
    applies), truncate (True) and partial_rotary_factor (1.0); rope_type "default" is plain RoPE
    (None), with no YaRN key."""
    if yarn is None:
        return None
    if not isinstance(yarn, dict):
        raise invalid_argument(f"{op}: expected yarn a dict or None, got {type(yarn).__name__}")
    values = {**_C.YARN_DEFAULTS, **_YARN_ABSENT}
    given, fixed, plain = set(), {}, False
    for key, value in yarn.items():
        if key in _YARN_TYPE_KEYS:
            if value not in ("yarn", "default"):
                raise invalid_argument(
                    f"{op}: yarn[{key!r}]: expected 'yarn' or 'default', got {value!r}")
            plain = plain or value == "default"
            continue
        if key in _YARN_FIXED_KEYS:
            fixed[key] = value
            continue
        name = _YARN_ALIASES.get(key, key)
        if name not in YARN_KEYS:
            raise invalid_argument(f"{op}: unknown yarn key {key!r} (expected {YARN_KEYS}, "
                                   f"or {_YARN_FIXED_KEYS})")
        values[name] = value
        given.add(key)
    if plain:
        if given or fixed.get("attention_factor") is not None:
            raise invalid_argument(f"{op}: yarn: rope_type 'default' (plain RoPE) with YaRN keys "
                                   f"{sorted(given | set(fixed) - {'rope_theta'})}")
        _check_fixed_yarn_keys(op, fixed, values, theta)
        return None
    _check_fixed_yarn_keys(op, fixed, values, theta)
    max_position = values["original_max_position"]
    try:
        if isinstance(max_position, bool):
            raise TypeError
        if isinstance(max_position, float) and max_position.is_integer():
            max_position = int(max_position)
        max_position = operator.index(max_position)
    except TypeError:
        raise invalid_argument(
            f"{op}: yarn['original_max_position']: expected an integer, got {max_position!r}"
        ) from None
    return [float(values["factor"]), float(max_position), float(values["beta_fast"]),
            float(values["beta_slow"]), float(values["mscale"]), float(values["mscale_all_dim"])]


def yarn_tuple(numbers):
    """_C's YaRN argument (original_max_position an integer) from yarn_list's numbers or None."""
    if numbers is None:
        return None
    return (numbers[0], int(numbers[1]), numbers[2], numbers[3], numbers[4], numbers[5])


def out_shape(shape, last: int):
    """`shape` with its last dim replaced by `last` (a 0-d shape becomes (last,))."""
    return tuple(shape[:-1]) + (last,)


def transposed_pitch(n: int) -> int:
    """Token pitch of an allocated transposed V: n rounded up to 16, at least 16 (TMA needs
    16-byte rows); C++'s fp8mla::transposed_v_pitch. Python arithmetic, so that a symbolic n
    (torch.compile) passes through."""
    return max(16, (n + 15) // 16 * 16)
