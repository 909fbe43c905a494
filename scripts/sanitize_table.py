#!/usr/bin/env python3
"""The table of scripts/sanitize.sh: one row per (tool, binary, gtest filter) item, read from
rows.tsv (tool, binary, listed cases, exit status, seconds, log path) and each item's log.

  tool | binary | cases | launched kernels | errors | seconds | status

cases: passed/listed (plus skipped and failed counts when not 0), from gtest's
"[  PASSED  ] N tests" / "[  SKIPPED ] N tests" / "[  FAILED  ] N tests" lines or pytest's
summary line. An item is "clean" only with exit status 0, the sanitizer's summary line with 0
errors, and more than 0 passed cases; all skipped (or none run) is a failure of the run, and so
is a pytest item that skipped a test for want of a GPU (the reason tests/python/torch_helpers.py
gives, listed by pytest's -rs): its CUDA cases did not run, only its CPU ones.
launched kernels: lines of the sanitizer's info-level output that name a kernel launch, "-" when
it printed none. Exit status "-" (and log "-"): the item was not started, its share's
--deadline-s having passed; such a row is not clean either. --self-test checks the parsing on
made-up logs. Exit status 1 when a row is not clean.
"""
import re
import sys
import tempfile

SUMMARY = re.compile(r'ERROR SUMMARY: (\d+) errors?')
RACE_SUMMARY = re.compile(r'RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?')
LAUNCH = re.compile(r'^=+ .*\b[Kk]ernel\b.*\blaunch', re.M)
GTEST = {'passed': re.compile(r'^\[  PASSED  \] (\d+) tests?', re.M),
         'skipped': re.compile(r'^\[  SKIPPED \] (\d+) tests?', re.M),
         'failed': re.compile(r'^\[  FAILED  \] (\d+) tests?', re.M)}
PYTEST = {k: re.compile(r'\b(\d+) ' + k + r'\b') for k in ('passed', 'skipped', 'failed')}
NO_GPU = re.compile(r'^SKIPPED .*needs a CUDA GPU', re.M)


def parse(binary, status, text):
    """(counts, launches, errors, status word) of one item's log."""
    patterns = PYTEST if binary.startswith('pytest:') else GTEST
    counts = {}
    for k, p in patterns.items():
        found = p.findall(text)
        counts[k] = int(found[-1]) if found else 0
    summaries = [int(e) for e in SUMMARY.findall(text)] + [int(e) for e in
                                                           RACE_SUMMARY.findall(text)]
    errors = sum(summaries) if summaries else None
    launches = len(LAUNCH.findall(text))
    if status in (124, 137):
        word = 'TIMEOUT'
    elif errors is None:
        word = 'FAIL (no sanitizer summary)'
    elif errors > 0 or status == 99:
        word = 'ERRORS'
    elif counts['failed'] > 0 or status != 0:
        word = f'FAIL (exit {status})'
    elif counts['passed'] == 0:
        word = 'FAIL (all skipped)' if counts['skipped'] else 'FAIL (no cases ran)'
    elif binary.startswith('pytest:') and NO_GPU.search(text):
        word = 'FAIL (GPU cases skipped)'
    else:
        word = 'clean'
    return counts, launches, errors, word


def table(rows):
    header = ('tool', 'binary', 'cases', 'launched kernels', 'errors', 'seconds', 'status')
    lines, bad = [], 0
    for tool, binary, listed, status, seconds, log in rows:
        if status == '-':
            lines.append((tool, binary, f'0/{listed}', '-', '-', seconds, 'not started (deadline)'))
            bad += 1
            continue
        try:
            text = open(log, errors='replace').read()
        except OSError:
            text = ''
        counts, launches, errors, word = parse(binary, int(status), text)
        cases = f"{counts['passed']}/{listed}"
        if counts['skipped']:
            cases += f" ({counts['skipped']} skipped)"
        if counts['failed']:
            cases += f" ({counts['failed']} failed)"
        bad += word != 'clean'
        lines.append((tool, binary, cases, str(launches) if launches else '-',
                      '-' if errors is None else str(errors), seconds, word))
    widths = [max(len(r[i]) for r in [header] + lines) for i in range(len(header))]
    for r in [header] + lines:
        print(' | '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f'{len(lines) - bad} of {len(lines)} items clean')
    return 1 if bad or not lines else 0


def self_test():
    logs = {
        'clean': '[==========] 3 tests ran.\n[  PASSED  ] 3 tests.\n'
                 '========= ERROR SUMMARY: 0 errors\n',
        'skipped': '[  PASSED  ] 0 tests.\n[  SKIPPED ] 3 tests, listed below:\n'
                   '========= ERROR SUMMARY: 0 errors\n',
        'errors': '[  PASSED  ] 3 tests.\n========= Invalid __global__ read of size 4\n'
                  '========= ERROR SUMMARY: 2 errors\n',
        'cut': '[ RUN      ] A.B\n',
        'race': '[  PASSED  ] 1 test.\n========= RACECHECK SUMMARY: 0 hazards displayed '
                '(0 errors, 0 warnings)\n',
        'pytest': 'SKIPPED [1] t.py:9: needs two ranks\n5 passed, 2 skipped in 3.1s\n'
                  '========= ERROR SUMMARY: 0 errors\n',
        'pytest_no_gpu': 'SKIPPED [3] t.py:12: needs a CUDA GPU visible to torch and an fp8mla '
                         'built with CUDA\n5 passed, 3 skipped in 2.0s\n'
                         '========= ERROR SUMMARY: 0 errors\n',
    }
    want = {'clean': 'clean', 'skipped': 'FAIL (all skipped)', 'errors': 'ERRORS',
            'cut': 'FAIL (no sanitizer summary)', 'race': 'clean', 'pytest': 'clean',
            'pytest_no_gpu': 'FAIL (GPU cases skipped)'}
    ok = True
    with tempfile.TemporaryDirectory() as d:
        for name, text in logs.items():
            path = f'{d}/{name}.log'
            open(path, 'w').write(text)
            binary = 'pytest:t.py' if name.startswith('pytest') else 'x_cuda_test'
            status = 99 if name == 'errors' else (124 if name == 'cut' else 0)
            got = parse(binary, status, text)[3]
            expected = 'TIMEOUT' if name == 'cut' else want[name]
            ok &= got == expected
            print(f'{name}: {got}' + ('' if got == expected else f' (expected {expected})'))
    print('self-test ' + ('passed' if ok else 'FAILED'))
    return 0 if ok else 1


def main():
    if sys.argv[1:] == ['--self-test']:
        return self_test()
    rows = [line.rstrip('\n').split('\t') for line in open(sys.argv[1]) if line.strip()]
    return table(rows)


if __name__ == '__main__':
    sys.exit(main())
