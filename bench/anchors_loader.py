"""Finding and importing ../shared/anchors/anchors.py (the alternatives every benchmark times
fp8mla against) for the scripts of this folder."""
from __future__ import annotations

import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_anchors(path, script):
    """Imports anchors.py from `path` (the file or its folder), else from the usual places;
    returns (module, file). `script` names the caller in the error."""
    candidates = [path] if path else []
    candidates += [os.path.join(REPO, "..", "shared", "anchors"), os.path.join(REPO, ".anchors"),
                   os.path.join(REPO, "bench"), os.path.join(REPO, "anchors"), REPO]
    for c in candidates:
        f = c if c.endswith(".py") else os.path.join(c, "anchors.py")
        if os.path.isfile(f):
            spec = importlib.util.spec_from_file_location("anchors", f)
            module = importlib.util.module_from_spec(spec)
            sys.modules["anchors"] = module
            spec.loader.exec_module(module)
            return module, os.path.abspath(f)
    sys.exit(f"{script}: anchors.py not found (tried {candidates}); pass --anchors PATH")
