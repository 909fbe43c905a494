"""The examples and the user guide's snippets run as they are: examples/engine_prefill.py on the
CPU (numpy), each step's output against the float64 reference of the layer; the Python snippets
of docs/user-guide.md in order, the numpy ones everywhere and the torch ones (on CPU tensors)
where torch is installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("ml_dtypes")

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)


def run_python(args, timeout, env=None):
    run = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                         timeout=timeout, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_engine_prefill_on_the_cpu():
    stdout = run_python([os.path.join(ROOT, "examples", "engine_prefill.py"), "--device", "cpu"],
                        timeout=300)
    cosines = [float(c) for c in re.findall(r"cosine to the float64 reference ([0-9.]+)", stdout)]
    assert len(cosines) == 2, stdout  # a step without a prefix, and one with
    assert min(cosines) >= 0.999, stdout
    assert "backend 'cpu'" in stdout and stdout.rstrip().splitlines()[-1].startswith("ok")


def guide_snippets(uses_torch: bool) -> list:
    """The ```python blocks of the user guide that use torch (outside comments), or the others."""
    with open(os.path.join(ROOT, "docs", "user-guide.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    return [b for b in blocks
            if bool(re.search(r"\btorch\b", re.sub(r"#.*", "", b))) == uses_torch]


def test_user_guide_numpy_snippets():
    snippets = guide_snippets(uses_torch=False)
    assert len(snippets) >= 8, "the guide's numpy snippets were not found"
    stdout = run_python(["-c", "\n".join(snippets)], timeout=300)
    assert "fp8_group128" in stdout and "(6, 4, 128) bfloat16 (6, 4)" in stdout, stdout


def test_user_guide_torch_snippets(tmp_path):
    pytest.importorskip("torch")
    snippets = guide_snippets(uses_torch=True)
    assert len(snippets) >= 2, "the guide's torch snippets were not found"
    # A graph Inductor loads from its cache does not run the fusion pass again: a fresh cache.
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    stdout = run_python(["-c", "\n".join(snippets)], timeout=600, env=env)
    assert "key='fp8_group128'" in stdout, stdout  # the fusion pass fused the pair
