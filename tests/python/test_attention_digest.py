"""bench/attention_digest.py --compare: which outputs of each build differ from the first's (the
check behind scripts/attention-ab.sh --digest). The digests themselves need CUDA torch."""

import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, BENCH)
import attention_digest  # noqa: E402


def write(tmp_path, name, digests):
    path = tmp_path / name
    path.write_text(json.dumps({"fp8mla": "here", "digests": digests}))
    return str(path)


BASE = {"1x100 causal": {"e4m3": "a1", "bf16": "b1"}, "1x100 full": {"e4m3": "a2", "bf16": "b2"}}


def test_identical_builds_say_so(tmp_path):
    first = write(tmp_path, "digest_main.json", BASE)
    same = write(tmp_path, "digest_same.json", json.loads(json.dumps(BASE)))
    assert attention_digest.compare([first, same]) == [
        "digest_same.json against digest_main.json: all 4 outputs identical"]


def test_differing_and_missing_outputs_are_named(tmp_path):
    first = write(tmp_path, "digest_main.json", BASE)
    other = write(tmp_path, "digest_new.json",
                  {"1x100 causal": {"e4m3": "a1", "bf16": "XX"}, "1x100 full": {"e4m3": "a2"}})
    (line,) = attention_digest.compare([first, other])
    assert line == ("digest_new.json against digest_main.json: 2 of 4 differ: "
                    "1x100 causal bf16; 1x100 full bf16")


def test_unreadable_files_are_reported_not_raised(tmp_path):
    first = write(tmp_path, "digest_main.json", BASE)
    broken = tmp_path / "digest_broken.json"
    broken.write_text("{not json")
    lines = attention_digest.compare([first, str(broken), str(tmp_path / "digest_gone.json")])
    assert lines == ["digest_broken.json: unreadable (JSONDecodeError)",
                     "digest_gone.json: unreadable (FileNotFoundError)"]


def test_command_line_compare(tmp_path):
    first = write(tmp_path, "digest_main.json", BASE)
    same = write(tmp_path, "digest_same.json", BASE)
    done = subprocess.run([sys.executable, os.path.join(BENCH, "attention_digest.py"), "--compare",
                           first, same], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ("digest_same.json against digest_main.json: "
                                   "all 4 outputs identical")
