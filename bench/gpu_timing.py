"""Timing a CUDA-graph replay the way `fp8mla bench` does, and reading the SM clock while it runs.

Why both: on an H200 a few hundred milliseconds of FP8 attention reach the card's 700 W limit,
and the driver then lowers the SM clock (1980 -> ~1850 MHz for the e4m3 kernel, ~1560 for the
bf16 one, in the 2026-11-30 runs). A figure means little without the state of the card it was
taken in, so each timing here comes with the clock it ran at.

- `graphed(torch, fn)`: fn captured in a CUDA graph; returns its replay.
- `run_for(torch, replay, seconds)`: back-to-back replays (warm-up, or load up to the power cap).
- `time_queued(torch, replay, iters)`: median device time of one replay. All replays and their
  event pairs are queued behind a sleep kernel first, so they run back to back and no host time
  enters (the anchors' timer waits for each call, which adds the launch's host latency).
- `ClockSampler`: SM clock and power-cap state from NVML (libnvidia-ml through ctypes, no Python
  package), sampled from a thread while the timed replays run.
"""
from __future__ import annotations

import contextlib
import ctypes
import statistics
import threading
import time

_NVML_CLOCK_SM = 1
_SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap
_HW_SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80  # HW slowdown, SW/HW thermal, HW power brake


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


def run_for(torch, replay, seconds):
    """Replays back to back for about `seconds`, then waits for the device."""
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(4):
            replay()
        torch.cuda.synchronize()


def time_queued(torch, replay, iters, gate_ms=5.0):
    """Median milliseconds of one replay over `iters` replays run back to back."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    torch.cuda._sleep(int(gate_ms * 1e-3 * 2e9))  # ~gate_ms: holds the stream while the host queues
    for s, e in zip(starts, ends):
        s.record()
        replay()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


class ClockSampler:
    """`with sampler.sampling(): ...` records the SM clock every `period_s` while the block runs;
    `summary()` then gives its median and minimum (MHz) and the share of samples under the
    software power cap. Without NVML (no driver library), every summary is None."""

    def __init__(self, torch, period_s=0.002):
        self.period_s = period_s
        self.samples = []
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

    @property
    def available(self):
        return self._device is not None

    def _sample(self):
        clock = ctypes.c_uint()
        reasons = ctypes.c_ulonglong()
        if self._nvml.nvmlDeviceGetClockInfo(self._device, _NVML_CLOCK_SM,
                                             ctypes.byref(clock)) != 0:
            return
        if self._reasons(self._device, ctypes.byref(reasons)) != 0:
            reasons.value = 0
        self.samples.append((clock.value, reasons.value))

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

    def summary(self):
        if not self.samples:
            return None
        clocks = [c for c, _ in self.samples]
        return {"sm_mhz_median": statistics.median(clocks), "sm_mhz_min": min(clocks),
                "power_capped_share": sum(1 for _, r in self.samples if r & _SW_POWER_CAP)
                / len(self.samples),
                "hw_slowdown_share": sum(1 for _, r in self.samples if r & _HW_SLOWDOWN)
                / len(self.samples),
                "samples": len(self.samples)}
