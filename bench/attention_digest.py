"""Digests of fp8mla.prefill_attention's outputs on fixed inputs, to tell whether two builds give
the same bytes (scripts/attention-ab.sh --digest compares every build with the first).

Each case is a batch (query lengths, cached-prefix lengths, heads, causal) whose inputs come from
a seeded generator, so every process and build sees the same tensors. For each case and each of
fp8mla's forms (e4m3 with V transposed, with an LSE, with V token-major; bf16, with an LSE) it
records a SHA-256 of the output bytes (and of the LSE). The cases reach one key tile and
partial tiles, the promotion boundaries of e4m3 (8 and 16 key tiles), prefixes and ragged
batches, and the batches that run on the persistent grid (many short sequences).

    python3 bench/attention_digest.py --json OUT.json
    python3 bench/attention_digest.py --compare FIRST.json OTHER.json ...   # what differs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

# (query lengths, prefix lengths, heads); every case runs causal and full.
CASES = [
    ([1], [0], 4),
    ([100], [0], 4),
    ([128], [0], 4),
    ([129], [0], 4),
    ([1030], [0], 4),          # 9 key tiles: one past a promotion
    ([2100], [0], 4),          # 17 key tiles
    ([300], [1800], 4),        # a prefix: long key runs on short query blocks
    ([4099], [0], 16),
    ([3000, 17, 700, 5000, 1, 2200], [0, 5, 300, 2000, 0, 1000], 8),
    ([64] * 35 + [100] + [64] * 34, [0] * 70, 16),  # the persistent grid, a longer one inside
    ([1024] * 16, [0] * 16, 16),
]


def digest(torch, t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def run_case(torch, fp8mla, q_lens, prefix_lens, heads, causal, seed):
    from attention import make_inputs

    x = make_inputs(torch, q_lens, prefix_lens, heads, seed)
    forms = {
        "e4m3": (x.q8, x.k8, x.v8t, True, False),
        "e4m3_lse": (x.q8, x.k8, x.v8t, True, True),
        "e4m3_vtok": (x.q8, x.k8, x.v8, True, False),
        "bf16": (x.q, x.k, x.v, False, False),
        "bf16_lse": (x.q, x.k, x.v, False, True),
    }
    result = {}
    for form, (q, k, v, fp8, with_lse) in forms.items():
        kw = dict(q_descale=x.qs, k_descale=x.ks, v_descale=x.vs) if fp8 else {}
        out = torch.full_like(x.out, float("nan"))
        lse = torch.full_like(x.lse, float("nan")) if with_lse else None
        if lse is not None:
            kw["lse"] = lse
        fp8mla.prefill_attention(q, k, v, x.cu_q, x.cu_k, x.max_q, x.max_k,
                                 softmax_scale=x.scale, causal=causal, out=out, **kw)
        torch.cuda.synchronize()
        result[form] = digest(torch, out) + (":" + digest(torch, lse) if lse is not None else "")
    return result


def compare(paths):
    """One line for each file after the first: which of the first file's outputs it gives other
    bytes for (or lacks), or that all are identical."""
    def load(path):
        try:
            with open(path) as f:
                return json.load(f)["digests"]
        except (OSError, ValueError, KeyError) as e:
            return f"unreadable ({e.__class__.__name__})"
    first, lines = load(paths[0]), []
    if isinstance(first, str):
        return [f"{os.path.basename(paths[0])}: {first}"]
    total = sum(len(forms) for forms in first.values())
    for path in paths[1:]:
        other = load(path)
        name = os.path.basename(path)
        if isinstance(other, str):
            lines.append(f"{name}: {other}")
            continue
        diff = [f"{case} {form}" for case, forms in first.items() for form, digest in forms.items()
                if other.get(case, {}).get(form) != digest]
        lines.append(f"{name} against {os.path.basename(paths[0])}: " +
                     (f"all {total} outputs identical" if not diff else
                      f"{len(diff)} of {total} differ: " + "; ".join(diff)))
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--json", help="where to write {case: {form: digest}}")
    mode.add_argument("--compare", nargs="+", metavar="FILE",
                      help="digest files: say what each one after the first gives other bytes for")
    args = parser.parse_args()
    if args.compare:
        print("\n".join(compare(args.compare)))
        return
    import torch

    import fp8mla
    digests = {}
    for i, (q_lens, prefix_lens, heads) in enumerate(CASES):
        for causal in (True, False):
            name = (f"{len(q_lens)}x{max(q_lens)}+{max(prefix_lens)} h{heads} "
                    f"{'causal' if causal else 'full'}")
            digests[name] = run_case(torch, fp8mla, q_lens, prefix_lens, heads, causal, seed=i)
    with open(args.json, "w") as f:
        json.dump({"fp8mla": fp8mla.__file__, "digests": digests}, f, indent=1)
    print(f"{sum(len(d) for d in digests.values())} outputs of {len(digests)} cases -> {args.json}")


if __name__ == "__main__":
    main()
