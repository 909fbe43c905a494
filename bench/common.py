"""What every Python benchmark of this folder shares: finding the anchors and FA3, the one GPU
timer, the SM clock sampler, random inputs, the device-copy ceiling, and the fp8mla-vs-anchor rows
of the memory-bound benchmarks (quant.py, prep.py) with their console table and JSON document.

The timer, `time_ms(torch, fn, iters, warmup, queued)`: CUDA events around each call, median.
- queued=True: all timed calls and their event pairs are queued behind a sleep kernel first, so
  they run back to back and no host time enters (the method of `fp8mla bench` with its gate);
  attention.py times CUDA-graph replays this way, through `time_for`, which sizes the number of
  calls to a duration (about 30 ms of replays) from an estimate of one call.
- queued=False (host-paced): each call is waited for before the next is issued, so a call shorter
  than its host latency is timed with that latency (quant.py, prep.py and layer.py, whose kept
  results were taken this way; `anchors.bench` times the same way).

Why the clock: on an H200 a few hundred milliseconds of FP8 attention reach the card's 700 W
limit, and the driver then lowers the SM clock (1980 -> ~1850 MHz for the e4m3 kernel, ~1560 for
the bf16 one, in the 2026-11-30 runs). A figure means little without the state of the card it was
taken in, so attention.py's timings come with the clock they ran at: `ClockSampler` reads the SM
clock, the power-cap state and the power draw from NVML (libnvidia-ml through ctypes, no Python
package) from a thread while the timed calls run. The power is NVML's instantaneous reading
(field NVML_FI_DEV_POWER_INSTANT, refreshed about every 20 ms) where the driver has it, else
nvmlDeviceGetPowerUsage, which on Hopper averages over the last second.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import importlib.metadata
import importlib.util
import itertools
import json
import math
import os
import statistics
import sys
import threading
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_NVML_CLOCK_SM = 1
_NVML_FI_DEV_POWER_INSTANT = 186  # milliwatts
_SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap
_HW_SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80  # HW slowdown, SW/HW thermal, HW power brake


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def find_anchors(path, script):
    """The file anchors.py (the alternatives every benchmark times fp8mla against): `path` (the
    file or its folder), else the usual places. `script` names the caller in the error."""
    candidates = [path] if path else []
    candidates += [os.path.join(REPO, "..", "shared", "anchors"), os.path.join(REPO, ".anchors"),
                   os.path.join(REPO, "bench"), os.path.join(REPO, "anchors"), REPO]
    for c in candidates:
        f = c if c.endswith(".py") else os.path.join(c, "anchors.py")
        if os.path.isfile(f):
            return os.path.abspath(f)
    sys.exit(f"{script}: anchors.py not found (tried {candidates}); pass --anchors PATH")


def load_anchors(path, script):
    """Imports anchors.py (see find_anchors); returns (module, file)."""
    f = find_anchors(path, script)
    spec = importlib.util.spec_from_file_location("anchors", f)
    module = importlib.util.module_from_spec(spec)
    sys.modules["anchors"] = module
    spec.loader.exec_module(module)
    return module, f


def load_fa3():
    """(fa3_fwd_interface, "fa3_fwd VERSION") or (None, why it does not import)."""
    try:
        import fa3_fwd_interface
    except Exception as e:  # noqa: BLE001 - FA3's rows become error rows, the rest runs
        return None, f"unavailable ({type(e).__name__}: {e})"
    try:
        version = importlib.metadata.version("fa3_fwd")
    except importlib.metadata.PackageNotFoundError:
        version = "(no package metadata)"
    return fa3_fwd_interface, f"fa3_fwd {version}"


# ---- The timer --------------------------------------------------------------------------------

def graphed(torch, fn):
    """fn captured in a CUDA graph (after a warm-up call on a side stream); returns replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def run_for(torch, fn, seconds):
    """Calls fn back to back for about `seconds`, then waits for the device."""
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(4):
            fn()
        torch.cuda.synchronize()


def time_ms(torch, fn, iters, warmup=0, queued=True, gate_ms=5.0,
            while_running=contextlib.nullcontext, lead=0):
    """Median milliseconds of one fn() over `iters` timed calls after `warmup` untimed ones
    (queued or host-paced: see the module docstring). Queued, `lead` untimed calls run right
    before the timed ones, behind the same gate (no idle gap between them). `while_running()`, a
    context manager, is entered while the device runs the timed calls: queued, from the end of
    the gate (and the lead) until the last call is done (a clock sampler then sees only the
    timed calls)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    if queued:
        torch.cuda._sleep(int(gate_ms * 1e-3 * 2e9))  # ~gate_ms: holds the stream while queuing
        gate_end, lead_end = torch.cuda.Event(), torch.cuda.Event()
        gate_end.record()
        for _ in range(lead):
            fn()
        lead_end.record()
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        gate_end.synchronize()
        lead_end.synchronize()
        with while_running():
            torch.cuda.synchronize()
    else:
        with while_running():
            for s, e in zip(starts, ends):
                s.record()
                fn()
                e.record()
                e.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_for(torch, fn, budget_ms, estimate_ms, min_calls=3, while_running=contextlib.nullcontext,
             lead_ms=0.0):
    """(median milliseconds of one fn(), calls timed): time_ms, queued, over as many calls as
    take about `budget_ms` at `estimate_ms` a call (at least `min_calls`), after untimed calls
    for about `lead_ms`. The gate grows with the calls (20 us each on top of 5 ms), so the host
    has queued them all before it opens."""
    estimate_ms = max(estimate_ms, 1e-3)
    calls = max(min_calls, math.ceil(budget_ms / estimate_ms))
    lead = math.ceil(lead_ms / estimate_ms)
    ms = time_ms(torch, fn, calls, queued=True, gate_ms=5.0 + 0.02 * (calls + lead),
                 while_running=while_running, lead=lead)
    return ms, calls


class _NvmlValue(ctypes.Union):
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong),
                ("siVal", ctypes.c_int), ("usVal", ctypes.c_ushort)]


class _NvmlFieldValue(ctypes.Structure):
    """nvmlFieldValue_t; `value` is read by `valueType` (the type varies with the driver)."""
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint),
                ("timestamp", ctypes.c_longlong), ("latencyUsec", ctypes.c_longlong),
                ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int), ("value", _NvmlValue)]

    TYPES = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # nvmlValueType_t

    def number(self):
        if not 0 <= self.valueType < len(self.TYPES):
            return None
        return getattr(self.value, self.TYPES[self.valueType])


class ClockSampler:
    """`with sampler.sampling(): ...` records the SM clock, the clock event reasons and the power
    draw every `period_s` while the block runs (into `samples`); `summary()` then gives the
    clock's median and minimum (MHz), the share of samples under the software power cap and the
    mean power (W; `power_source` says which reading, see the module docstring). Without NVML (no
    driver library), every summary is None."""

    def __init__(self, torch, period_s=0.002):
        self.period_s = period_s
        self.samples = []
        self.power_source = None
        self._device = None
        try:
            self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if self._nvml.nvmlInit_v2() != 0:
                return
            device = ctypes.c_void_p()
            bus = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()),
                          "pci_bus_id", None)
            ok = False
            if bus is not None:
                props = torch.cuda.get_device_properties(torch.cuda.current_device())
                pci = f"{props.pci_domain_id:08x}:{bus:02x}:{props.pci_device_id:02x}.0"
                ok = self._nvml.nvmlDeviceGetHandleByPciBusId_v2(pci.encode(),
                                                                 ctypes.byref(device)) == 0
            if not ok and self._nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device)) != 0:
                return
            self._reasons = getattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
                or self._nvml.nvmlDeviceGetCurrentClocksThrottleReasons
            self._device = device
        except (OSError, AttributeError):
            self._device = None
            return
        self._field = _NvmlFieldValue()
        try:
            instant = self._instant_power()
        except AttributeError:  # a driver library without nvmlDeviceGetFieldValues
            instant = None
        if instant is not None:
            self.power_source = "NVML_FI_DEV_POWER_INSTANT"
        else:
            self._field = None
            if self._power() is not None:
                self.power_source = "nvmlDeviceGetPowerUsage (1 s average)"

    @property
    def available(self):
        return self._device is not None

    def _instant_power(self):
        """Milliwatts from the instantaneous power field, or None."""
        self._field.fieldId = _NVML_FI_DEV_POWER_INSTANT
        if self._nvml.nvmlDeviceGetFieldValues(self._device, 1, ctypes.byref(self._field)) != 0 \
                or self._field.nvmlReturn != 0:
            return None
        return self._field.number()

    def _power(self):
        """Milliwatts (see power_source), or None."""
        if self._field is not None:
            return self._instant_power()
        mw = ctypes.c_uint()
        if self._nvml.nvmlDeviceGetPowerUsage(self._device, ctypes.byref(mw)) != 0:
            return None
        return mw.value

    def _sample(self):
        clock = ctypes.c_uint()
        reasons = ctypes.c_ulonglong()
        if self._nvml.nvmlDeviceGetClockInfo(self._device, _NVML_CLOCK_SM,
                                             ctypes.byref(clock)) != 0:
            return
        if self._reasons(self._device, ctypes.byref(reasons)) != 0:
            reasons.value = 0
        self.samples.append((clock.value, reasons.value,
                             self._power() if self.power_source else None))

    @contextlib.contextmanager
    def sampling(self):
        self.samples = []
        if not self.available:
            yield
            return
        stop = threading.Event()

        def loop():
            while not stop.is_set():
                self._sample()
                time.sleep(self.period_s)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def summary(self, samples=None):
        """The summary of `samples` (default: those of the last sampling block; several blocks'
        samples may be joined), or None without samples."""
        samples = self.samples if samples is None else samples
        if not samples:
            return None
        clocks = [c for c, _, _ in samples]
        power = [p for _, _, p in samples if p is not None]
        return {"sm_mhz_median": statistics.median(clocks), "sm_mhz_min": min(clocks),
                "power_capped_share": sum(1 for _, r, _ in samples if r & _SW_POWER_CAP)
                / len(samples),
                "hw_slowdown_share": sum(1 for _, r, _ in samples if r & _HW_SLOWDOWN)
                / len(samples),
                "power_w_mean": statistics.fmean(power) / 1e3 if power else None,
                "samples": len(samples)}


# ---- The memory-bound benchmarks (quant.py, prep.py) ------------------------------------------

def round_up(x, to):
    return (x + to - 1) // to * to


class MemoryBench:
    """fp8mla's ops and the anchors on the same tensors with the same timer (host-paced: see the
    module docstring). Inputs rotate through enough sets that they exceed 2x the L2; one counter
    runs across all implementations of a shape, so none reads an input another one has just
    pulled into the L2. A family (quant.py, prep.py) gives each shape's sets, fp8mla's callable
    and the anchors' callables, and reads the rows this returns."""

    TIMER = "CUDA events around each call, median (bench/common.py time_ms, host-paced)"

    def __init__(self, torch, anchors, fp8mla, fp8mla_error, args):
        self.torch, self.anchors, self.fp8mla, self.fp8mla_error = torch, anchors, fp8mla, fp8mla_error
        self.args = args
        props = torch.cuda.get_device_properties(0)
        self.l2 = int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)
        self.dev = torch.device("cuda", 0)

    def time_us(self, fn):
        return time_ms(self.torch, fn, self.args.iters, self.args.warmup, queued=False) * 1e3

    def sets_for(self, nbytes):
        return max(1, (2 * self.l2) // max(nbytes, 1) + 1)

    def random_bf16(self, shape):
        """Random non-zero bf16, |x| in [1/32, 16): magnitude in [1/32, 4), times 0.5..4 per
        block of 64 (so group and block scales differ), random sign; made in chunks to bound the
        float32 scratch."""
        torch = self.torch
        out = torch.empty(shape, dtype=torch.bfloat16, device=self.dev)
        flat = out.view(-1)
        chunk = 1 << 26
        for start in range(0, flat.numel(), chunk):
            part = flat[start:start + chunk]
            n = part.numel()
            x = torch.empty(n, dtype=torch.float32, device=self.dev).uniform_(1 / 32, 4)
            if n % 64 == 0:
                blocks = torch.randint(0, 4, (n // 64, 1), device=self.dev).float()
                x.view(-1, 64).mul_(torch.pow(2.0, blocks - 1))
            sign = torch.randint(0, 2, (n,), device=self.dev, dtype=torch.int8).bool()
            x = torch.where(sign, -x, x)
            part.copy_(x)
            del x, sign
        return out

    def copy_ceiling(self):
        """TB/s of a 1 GiB device-to-device copy (read + write counted)."""
        torch = self.torch
        n = 1 << 30
        a = torch.empty(n, dtype=torch.uint8, device=self.dev).random_()
        b = torch.empty_like(a)
        us = self.time_us(lambda: b.copy_(a))
        del a, b
        torch.cuda.empty_cache()
        return 2 * n / us / 1e6

    def compare(self, base, sets, fp8mla_callable, anchors, agreement):
        """One row per anchor: fp8mla's and the anchor's time on the same rotating sets.
        fp8mla_callable() -> (fn(set), outputs() -> set 0's outputs after timing); anchors:
        [(row fields, fn(set) or None, status, ref() -> set 0's outputs or None)];
        agreement(ours, theirs) -> fraction of equal bytes."""
        counter = itertools.count()
        nbytes = base["bytes"]

        def nxt():
            return next(counter) % sets

        fp8mla_fn, fp8mla_status, fp8mla_out = None, "ok", None
        if self.fp8mla is None:
            fp8mla_status = f"unavailable: {self.fp8mla_error}"
        else:
            try:
                fp8mla_fn, outputs = fp8mla_callable()
            except Exception as e:  # recorded, the anchors still run
                fp8mla_status = f"error: {type(e).__name__}: {e}"
                traceback.print_exc()
        fp8mla_us = None
        if fp8mla_fn is not None:
            try:
                fp8mla_us = self.time_us(lambda: fp8mla_fn(nxt()))
                fp8mla_out = outputs()
            except Exception as e:  # recorded, the anchors still run
                fp8mla_status = f"error: {type(e).__name__}: {e}"
                traceback.print_exc()
        rows = []
        for fields, fn, status, ref in anchors:
            anchor_us, agree = None, None
            if fn is not None:
                try:
                    anchor_us = self.time_us(lambda: fn(nxt()))
                    if fp8mla_out is not None and ref is not None:
                        agree = agreement(fp8mla_out, ref())
                except Exception as e:
                    status = f"error: {type(e).__name__}: {e}"
                    traceback.print_exc()
            self.torch.cuda.empty_cache()
            row = dict(base)
            row.update({
                "fp8mla_status": fp8mla_status,
                "fp8mla_us": fp8mla_us,
                "fp8mla_tbps": nbytes / fp8mla_us / 1e6 if fp8mla_us else None,
                **fields,
                "anchor_status": status,
                "anchor_us": anchor_us,
                "anchor_tbps": nbytes / anchor_us / 1e6 if anchor_us else None,
                "ratio": anchor_us / fp8mla_us if (anchor_us and fp8mla_us) else None,
                "output_agreement": agree,
            })
            rows.append(row)
        return rows


def byte_agreement(torch, ours, theirs):
    """Fraction of equal bytes of two tuples of tensors (None when their sizes differ)."""
    def as_bytes(ts):
        return torch.cat([t.contiguous().view(torch.uint8).reshape(-1) for t in ts])
    a, b = as_bytes(ours), as_bytes(theirs)
    if a.numel() != b.numel():
        return None
    return (a == b).sum().item() / a.numel()  # no float copy of a 10 GB mask


def start(script, args, runner_class):
    """Imports torch, triton, the anchors and fp8mla (None, with the reason, if it does not
    import: the anchors are still timed), makes the family's MemoryBench and measures the copy
    ceiling; prints the setting. Returns (runner, ceiling in TB/s)."""
    import torch
    import triton
    if not torch.cuda.is_available():
        sys.exit(f"{script}: needs a CUDA GPU")
    anchors, path = load_anchors(args.anchors, script)
    try:
        import fp8mla
        error = None
    except Exception as e:  # the anchors are still timed; fp8mla rows say why they are empty
        fp8mla, error = None, f"{type(e).__name__}: {e}"
        print(f"{script}: fp8mla not importable ({error})", file=sys.stderr)
    runner = runner_class(torch, anchors, fp8mla, error, args)
    runner.triton, runner.anchors_path = triton, path
    ceiling = runner.copy_ceiling()
    print(f"{torch.cuda.get_device_name(0)}: torch {torch.__version__}, triton "
          f"{triton.__version__}, anchors {path}")
    return runner, ceiling


def print_header(op_width, shape_width):
    print(f"{'op':<{op_width}} {'shape':<{shape_width}} {'MB':>10} {'fp8mla us':>10} {'TB/s':>6} "
          f"{'anchor':<14} {'anchor us':>10} {'TB/s':>6} {'ratio':>6}  agree")


def print_rows(rows, op_width, shape_width):
    def f(v, fmt):
        return format(v, fmt) if v is not None else "-"
    for r in rows:
        note = "" if r["anchor_status"] == "ok" else r["anchor_status"]
        if r["fp8mla_status"] != "ok":
            note += " fp8mla " + r["fp8mla_status"]
        print(f"{r['op']:<{op_width}} {r['shape']:<{shape_width}} {r['bytes'] / 1e6:10.3f} "
              f"{f(r['fp8mla_us'], '10.2f')} {f(r['fp8mla_tbps'], '6.3f')} "
              f"{r['anchor']:<14} {f(r['anchor_us'], '10.2f')} "
              f"{f(r['anchor_tbps'], '6.3f')} {f(r['ratio'], '6.2f')}  "
              f"{f(r['output_agreement'], '.4f')} {note}", flush=True)


def write_document(path, benchmark, runner, ceiling, results, **extra):
    """The JSON of a memory-bound benchmark (runner: from start()): the setting, then every
    row; returns it."""
    doc = {
        "benchmark": benchmark,
        "date": utc_now(),
        "device": runner.torch.cuda.get_device_name(0),
        "l2_bytes": runner.l2,
        "torch": runner.torch.__version__,
        "triton": runner.triton.__version__,
        "fp8mla_version": getattr(runner.fp8mla, "__version__", None),
        "anchors": runner.anchors_path,
        "timer": MemoryBench.TIMER,
        "warmup": runner.args.warmup,
        "iters": runner.args.iters,
        **extra,
        "copy_ceiling_tbps": ceiling,
        "ratio": "anchor us / fp8mla us (> 1: fp8mla faster)",
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {path}")
    return doc


def memory_arguments(doc, kind, ops, tokens_help):
    """The command line both memory-bound benchmarks share; the caller adds its own options."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--anchors", help="anchors.py or its folder (default: ../shared/anchors)")
    p.add_argument("--json", default=f"{kind}_py.json", help=f"output JSON (default {kind}_py.json)")
    p.add_argument("--plot", default=None, help="output PNG (default: the JSON path with .png)")
    p.add_argument("--op", default="all", help="comma-separated ops: all, " + ", ".join(ops))
    p.add_argument("--tokens", default=None, help=f"comma-separated T values (default {tokens_help})")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    return p


def selected(args, script, ops, default_tokens):
    """(ops, token counts) that --op and --tokens select."""
    chosen = ops if args.op == "all" else args.op.split(",")
    for op in chosen:
        if op not in ops:
            sys.exit(f"{script}: unknown op {op!r}; expected one of {ops}")
    return chosen, [int(t) for t in args.tokens.split(",")] if args.tokens else default_tokens
