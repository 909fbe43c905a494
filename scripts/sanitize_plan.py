#!/usr/bin/env python3
"""The work list of scripts/sanitize.sh, cut into shares.

  sanitize_plan.py CASES K/N BUDGET_S TOOLS JOBS [--times FILE] [--dry-run]

CASES: "BINARY CASE" lines. Items are (tool, binary, cases): each binary's cases in listed order,
minus EXCLUDE, cut into chunks whose estimated time fits half the budget and whose cases take the
same extra sanitizer options (OPTIONS). The items are dealt to N shares by estimated time (largest
first, to the least loaded share; ties to the lower share), so a share is the same list on every
machine. Prints share K's items as tab-separated lines
  ITEM  tool  binary  cases  estimate  filter  [options]
(filter: the cases joined by ':' for gtest, ' ' for pytest ids) and INFO lines.

Estimates: a case measured in the times file (tool, binary, case, seconds: what sanitize.sh
writes as OUT/case_times.tsv; default scripts/sanitize_times.tsv) counts its seconds x kMargin;
others the WEIGHTS table (seconds under memcheck) x the tool's FACTOR. Each item adds STARTUP.
"""
import argparse
import fnmatch
import os

# Seconds per case under memcheck where no measured time exists, first match wins: for the
# binaries of the 2026-12-02 sweep (scripts/sanitize_times.tsv) about its slowest case, for the
# others plain run times and a 10-30x instrumentation cost.
WEIGHTS = [
    # The CUDA pytest files took 8-152 s each, whole, under memcheck or synccheck (H200,
    # 2026-12-02; most of it torch's start): an id a few seconds, a file a minute or two.
    ('pytest:*', '*::*', 5),
    ('pytest:*', '*', 120),  # a whole file
    ('*', 'RerunCuda.*', 5),
    ('*', 'PdlChainCuda.*', 5),
    ('*', 'BatchInvarianceCuda.Prefill*', 30),
    ('*', 'BatchInvarianceCuda.*', 5),
    ('*', 'GraphCaptureCuda.*', 5),
    ('quantize_cuda_test', '*MatchesCpu', 60),
    ('quantize_cuda_test', '*StridedAndManyRows', 60),
    ('prefill_attention_cuda_test', '*', 30),
    ('output_quant*', '*', 15),
    ('mla_model_cuda_test', '*', 30),
    ('mla_prep_cuda_test', '*EveryTokenCount*', 60),
    ('random_agreement_cuda_test', '*', 5),
    ('*', '*', 10),
]
# racecheck measured 2-20x memcheck on the same case (the output-quant cases 190 s against 10).
FACTOR = {'memcheck': 1.0, 'racecheck': 5.0, 'initcheck': 2.0, 'synccheck': 1.0}
STARTUP = 10  # seconds to start a binary under the sanitizer
MARGIN = 1.5  # on a measured time: items run side by side and the GPU's clock varies
# (binary, case, tools or '*', why): cases no sanitizer run takes.
EXCLUDE = [
    ('*', '*Big*', '*', 'tensors past 2^31: hours under instrumentation; run them plainly'),
    ('*', '*Past2To31*', '*', 'more than 2^31 elements: hours under instrumentation'),
    ('*', '*Beyond2GiB*', '*', 'a cache past 2 GiB: hours under instrumentation'),
    ('cuda_runtime_test', 'CudaRuntime.LaunchErrorBecomesFp8mlaError', '*',
     'fails a launch on purpose: the sanitizer reports that API error'),
    ('cuda_runtime_test', 'CudaRuntime.RejectedTensorMapIsAnErrorAndNotCached', '*',
     'gives the driver a bad tensor map on purpose: the sanitizer reports that API error'),
    ('cuda_runtime_test', 'CudaRuntime.LaunchFromFreshThreads', 'racecheck',
     'racecheck loses track of launches from several host threads at once ("Internal Sanitizer '
     'Error: Detected a failure to track a kernel launch", H200, 2026-12-05); its kernel has no '
     'shared memory, and memcheck and synccheck keep the case'),
    ('numerics_cuda_test', 'NumericsCuda.HardwareConversionsEqualSoftwareCodec', '*',
     'the 2^32-value sweep'),
    *[('mla_model_cuda_test', cases, 'racecheck',
       "racecheck reports hazards inside cuBLASLt's kernels and, told to check fp8mla's kernels "
       "only (--kernel-name kns=fp8mla), fails on a hardware exception in cuBLASLt's GEMMs (H200, "
       "2026-12-02); the layer's own kernels are checked by LayerKernelsCuda, which calls no GEMM")
      for cases in ('Cublas*', '*Mla*')],
    ('mla_model_cuda_test', '*Mla*', 'initcheck',
     "initcheck does not see what cuBLASLt's block-scaled FP8 GEMMs write, and every layer case "
     "reads their outputs (a fresh buffer written only by such a GEMM, copied to the host: every "
     "byte reported uninitialized; none for a per-tensor-scaled GEMM or a plain kernel; H200, "
     "2026-12-02). The CublasLinearCuda cases poison their outputs first and stay in"),
]
# The Python layer tests run the layer's cuBLASLt GEMMs too: the same two tools leave them out.
EXCLUDE += [(f'pytest:tests/python/{name}', '*', tool, f'as for mla_model_cuda_test: {why}')
            for name in ('test_layer_*_torch.py', 'test_hf_reference_torch.py')
            for tool, why in (('racecheck', "hazards or a hardware exception in cuBLASLt's GEMMs"),
                              ('initcheck', "cuBLASLt's block-scaled FP8 GEMM writes unseen"))]
# (binary, case, tools or '*', extra sanitizer options, why).
OPTIONS = [
    ('mla_model_cuda_test', 'MlaContextParallelCudaNccl.*', '*', '--report-api-errors no',
     "NCCL's communicator init asks for the attributes of kernels it has no image of for this GPU "
     '(cudaFuncGetAttributes: error 209, handled inside libnccl)'),
    ('nccl_communicator_cuda_test', '*', 'memcheck', '--report-api-errors no',
     'the same probes of NCCL\'s communicator init (20 of them, H200 2026-12-02; the other tools '
     'report none)'),
    ('pytest:tests/python/test_layer_parallel_torch.py', '*', 'memcheck', '--report-api-errors no',
     "the same probes from torch.distributed's NCCL group (8, H200 2026-12-02)"),
    ('pytest:tests/python/test_output_quant_fusion_torch.py', '*', 'initcheck',
     '--kernel-name-exclude kns=triton_poi_fused_as_strided_clone',
     "Inductor's copy of a freshly allocated (torch.empty) column-major scale buffer before the "
     'op that writes it (functionalization of the mutated view) reads it uninitialized: 23 '
     'reports, all in that generated kernel (H200, 2026-12-02); fp8mla\'s kernels stay checked'),
]


def matches(rule, binary, case, tool):
    b, c, t = rule[:3]
    return fnmatch.fnmatch(binary, b) and fnmatch.fnmatch(case, c) and t in ('*', tool)


def options(binary, case, tool):
    return ' '.join(r[3] for r in OPTIONS if matches(r, binary, case, tool))


def load_times(path):
    times = {}
    if path and os.path.isfile(path):
        for line in open(path):
            f = line.rstrip('\n').split('\t')
            if len(f) == 4 and not line.startswith('#'):
                times[tuple(f[:3])] = float(f[3])
    return times


def estimate(times, tool, binary, case):
    if (tool, binary, case) in times:
        return times[(tool, binary, case)] * MARGIN
    w = next(w for b, c, w in WEIGHTS if fnmatch.fnmatch(binary, b) and fnmatch.fnmatch(case, c))
    return w * FACTOR.get(tool, 2.0)


def work_list(by_binary, tools, budget, times):
    """(items [(tool, binary, cases, estimate, options)], excluded tool/case pairs)."""
    items, left_out = [], 0
    for tool in tools:
        for binary in sorted(by_binary):
            chunk, total, opts = [], STARTUP, None
            for case in by_binary[binary]:
                if any(matches(r, binary, case, tool) for r in EXCLUDE):
                    left_out += 1
                    continue
                w, o = estimate(times, tool, binary, case), options(binary, case, tool)
                if chunk and (total + w > budget / 2 or o != opts):
                    items.append((tool, binary, chunk, total, opts))
                    chunk, total = [], STARTUP
                chunk.append(case)
                total += w
                opts = o
            if chunk:
                items.append((tool, binary, chunk, total, opts))
    return items, left_out


def deal(items, n):
    """Share index of each item: largest first to the least loaded share (ties: lower share)."""
    order = sorted(range(len(items)), key=lambda i: (-items[i][3], i))
    load, owner = [0.0] * n, {}
    for i in order:
        s = min(range(n), key=lambda j: (load[j], j))
        owner[i] = s
        load[s] += items[i][3]
    assert sorted(owner) == list(range(len(items))), 'shares do not partition the work list'
    return owner, load


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('cases')
    ap.add_argument('share')
    ap.add_argument('budget', type=float)
    ap.add_argument('tools')
    ap.add_argument('jobs', type=int)
    ap.add_argument('--times', default=os.path.join(os.path.dirname(__file__),
                                                     'sanitize_times.tsv'))
    ap.add_argument('--dry-run', action='store_true')
    a = ap.parse_args()
    k, n = map(int, a.share.split('/'))
    by_binary = {}
    for line in open(a.cases):
        binary, case = line.split()[:2]
        by_binary.setdefault(binary, []).append(case)
    times = load_times(a.times)
    items, left_out = work_list(by_binary, a.tools.split(','), a.budget, times)
    owner, load = deal(items, n)
    mine = [items[i] for i in range(len(items)) if owner[i] == k - 1]
    for tool, binary, chunk, est, opts in mine:
        filt = (' ' if binary.startswith('pytest:') else ':').join(chunk)
        print(f'ITEM\t{tool}\t{binary}\t{len(chunk)}\t{est:.0f}\t{filt}' + (f'\t{opts}' if opts else ''))
    measured = sum(1 for t, b, c, _, _ in items for case in c if (t, b, case) in times)
    print(f'INFO\t{len(items)} items in {n} shares ({left_out} excluded tool/case pairs); share {k}: '
          f'{len(mine)} items, estimated {load[k - 1]:.0f} s of {max(load):.0f} s in the largest share')
    capacity = a.budget * a.jobs  # a share runs `jobs` items at a time
    total = sum(load)
    print(f'INFO\tall shares: estimated {total:.0f} s ({measured} of '
          f'{sum(len(c) for _, _, c, _, _ in items)} tool/case pairs from measured times); shares of '
          f'at most {a.budget:.0f} s each, {a.jobs} item(s) at a time, would need '
          f'N >= {max(1, int(-(-total // capacity)))}')
    over = [f'{t} {b} ({e:.0f} s)' for t, b, _, e, _ in mine if e > a.budget]
    if over:
        print(f'INFO\testimated over the {a.budget:.0f} s budget (one case or a whole pytest file): '
              + ', '.join(over))
    if a.dry_run:
        print('INFO\tshares partition the work list: yes')
        for b, c, t, why in EXCLUDE:
            print(f'INFO\texcluded {b}:{c} ({t}): {why}')
        for b, c, t, o, why in OPTIONS:
            print(f'INFO\toptions {b}:{c} ({t}): {o}: {why}')


if __name__ == '__main__':
    main()
