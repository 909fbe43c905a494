#!/usr/bin/env python3
"""Static check of the PDL rule of src/cuda/common/launch.cuh: a kernel launched with the PDL
attribute must call pdl_wait() (griddepcontrol.wait) before its first dependent load.

What it checks, on the source text of src/cuda (comments stripped):
  - every kernel passed to cuda::launch(...) is a __global__ function defined under src/cuda
    (a variable holding the kernel is followed to the kernels assigned to it);
  - each of them calls pdl_wait() in its own body (every launch of the library may set the PDL
    attribute: LaunchConfig.pdl is true or a variable); --list prints where, as the line of the
    body, for review of what comes before it;
  - the body before that call has no visible global load: no load helper or __ldg call, no
    index or dereference of a parameter's pointer field (p.x[i], *a.scale), no ld.global;
  - no kernel is launched with <<<...>>> under src/cuda (that would bypass the PDL switch).
What it does not prove: that no dependent load precedes the wait on some path (a load inside a
helper of another name called before it, a pointer copied to a local and read), nor that pdl_launch_dependents() follows the last store, nor
anything about kernels launched through other paths (cuBLAS). The GPU tests (PDL on/off chains
that alternate their inputs, pdl_chain_cuda_test) look for those at run time.
Exit status 0 when every launched kernel waits, 1 otherwise. --list prints the kernels.
"""
import argparse
import pathlib
import re
import sys

LAUNCH = re.compile(r'\blaunch\s*\(\s*(?:"[^"]*"|[A-Za-z_][\w:]*)\s*,\s*([A-Za-z_]\w*)')
GLOBAL = re.compile(r'__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:void\s+)?'
                    r'([A-Za-z_]\w*)\s*\(')
# A global load written before the wait: a load helper or __ldg call, an index or dereference of
# a kernel parameter's pointer field (p.x[i], *a.scale), ld.global in inline PTX.
EARLY_LOAD = re.compile(r'\b(__ldg|load\w*)\s*\(|\b[a-z]\.\w+(\.\w+)*\s*\[|\*\s*[a-z]\.\w+|ld\.global')


def early_load(text):
    """The first EARLY_LOAD match in `text` that is not a multiplication (`row * p.stride`)."""
    for m in EARLY_LOAD.finditer(text):
        before = text[:m.start()].rstrip()
        if m.group(0).startswith('*') and before and (before[-1].isalnum() or before[-1] in '_)]'):
            continue
        return m.group(0)
    return None
TRIPLE_CHEVRON = re.compile(r'\b([A-Za-z_]\w*)\s*(?:<[^;<>]*>)?\s*<<<')


def strip_comments(text):
    text = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), text, flags=re.S)
    return re.sub(r'//[^\n]*', '', text)


def body_after(text, start):
    """The brace-balanced body that follows position `start`, and its offset."""
    open_at = text.index('{', start)
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == '{':
            depth += 1
        elif text[i] == '}':
            depth -= 1
            if depth == 0:
                return text[open_at:i + 1], open_at
    raise ValueError('unbalanced braces')


def self_test():
    """A tree with a kernel that waits, one that does not, one that loads before its wait and a
    <<<>>> launch: 3 problems."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        (pathlib.Path(root) / 'src' / 'cuda').mkdir(parents=True)
        (pathlib.Path(root) / 'src' / 'cuda' / 'k.cu').write_text(
            '__global__ void good_kernel(int* p) { pdl_wait(); *p = 1; }\n'
            '__global__ void __launch_bounds__(128) bad_kernel(int* p) { *p = 2; }\n'
            '__global__ void early_kernel(Params a) { int y = 2 * a.n; int x = a.in[y]; '
            'pdl_wait(); }\n'
            'void f(int* p) { launch("good", good_kernel, config, p);\n'
            '  launch("early", early_kernel, config, a);\n'
            '  auto kernel = bad_kernel; launch("bad", kernel, config, p);\n'
            '  good_kernel<<<1, 1>>>(p); }\n')
        run = subprocess.run([sys.executable, __file__, '--root', root], capture_output=True,
                             text=True)
    out = run.stdout
    ok = (run.returncode == 1 and '3 kernels launched through cuda::launch, 3 problems' in out
          and 'kernel bad_kernel' in out and 'launched with <<<>>>' in out
          and 'early_kernel reads `a.in[`' in out)
    print(out + ('self-test passed' if ok else 'self-test FAILED'))
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default=str(pathlib.Path(__file__).resolve().parent.parent))
    parser.add_argument('--list', action='store_true', help='print every launched kernel')
    parser.add_argument('--self-test', action='store_true',
                        help='check that a kernel without pdl_wait() is reported')
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    src = pathlib.Path(args.root) / 'src' / 'cuda'
    files = sorted(p for p in src.rglob('*') if p.suffix in ('.cu', '.cuh', '.in'))
    texts = {p: strip_comments(p.read_text()) for p in files}

    kernels = {}  # name -> (file, line, body)
    for path, text in texts.items():
        for m in GLOBAL.finditer(text):
            body, at = body_after(text, m.end())
            kernels[m.group(1)] = (path, text.count('\n', 0, at) + 1, body)

    failures = []
    launched = {}
    for path, text in texts.items():
        for m in LAUNCH.finditer(text):
            name = m.group(1)
            if name not in kernels:  # a variable: follow `name = kernel<...>` in the same file
                assigned = re.search(r'\b' + name + r'\s*=\s*(?:&\s*)?([A-Za-z_]\w*)', text)
                if assigned and assigned.group(1) in kernels:
                    name = assigned.group(1)
                else:
                    # A variable set in several branches: every kernel assigned to it.
                    names = set(re.findall(r'\b' + m.group(1) + r'\s*=\s*(?:&\s*)?([A-Za-z_]\w*)',
                                           text)) & set(kernels)
                    if not names:
                        failures.append(f'{path}:{text.count(chr(10), 0, m.start()) + 1}: '
                                        f'launch of {m.group(1)}, not a kernel defined in src/cuda')
                        continue
                    for n in names:
                        launched.setdefault(n, []).append(path)
                    continue
            launched.setdefault(name, []).append(path)
        for m in TRIPLE_CHEVRON.finditer(text):
            failures.append(f'{path}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)} '
                            'launched with <<<>>>, not through cuda::launch (PDL switch bypassed)')

    root = pathlib.Path(args.root)
    for name in sorted(launched):
        path, line, body = kernels[name]
        wait = body.find('pdl_wait()')
        where = f'{path.relative_to(root)}:{line}'
        if wait < 0:
            failures.append(f'{where}: kernel {name} is launched through cuda::launch but its body '
                            'has no pdl_wait()')
        else:
            early = early_load(body[:wait])
            if early:
                failures.append(f'{where}: kernel {name} reads `{early}` before pdl_wait()')
            elif args.list:
                print(f'{name:40s} {where}  pdl_wait at body line {body.count(chr(10), 0, wait) + 1}')
    if not launched:
        failures.append('no launches found: the pattern no longer matches the sources')
    for f in failures:
        print('FAIL', f)
    print(f'{len(launched)} kernels launched through cuda::launch, {len(failures)} problems')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
