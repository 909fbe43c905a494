"""The examples run as they are: examples/engine_prefill.py on the CPU (numpy), each step's output
against the float64 reference of the layer."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("ml_dtypes")

EXAMPLES = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples")


def test_engine_prefill_on_the_cpu():
    run = subprocess.run([sys.executable, os.path.join(EXAMPLES, "engine_prefill.py"),
                          "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    cosines = [float(c) for c in re.findall(r"cosine to the float64 reference ([0-9.]+)",
                                            run.stdout)]
    assert len(cosines) == 2, run.stdout  # a step without a prefix, and one with
    assert min(cosines) >= 0.999, run.stdout
    assert "backend 'cpu'" in run.stdout and run.stdout.rstrip().splitlines()[-1].startswith("ok")
