#!/usr/bin/env python3
"""Diagnosis of nvio.save's write path (issue 33): one save of one state,
with a time split and, optionally, the block requests it caused.

    python3 bench/save_diag.py --state big|small|one|mixed --mb 800 --dir /var/tmp \
        [--spare] [--split] [--rounds N] [--engine auto|psync|...]

--split wraps nvio's internal steps (Plan, the CRC wait, the data write,
the metadata write, commit) with timers in this process: a rough split,
for diagnosis only. Request counts come from outside: run it under
``perf record -e block:block_rq_issue`` or ``strace -f -c``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import nvio  # noqa: E402


def make_state(kind, mb):
    total = mb << 20
    g = torch.Generator().manual_seed(1)
    if kind == "one":
        return {"w": torch.empty(total // 4, dtype=torch.float32).uniform_(generator=g)}
    if kind == "big":           # llama-like: 64-180 MB each, scaled to total
        sizes = [180, 64, 64, 64, 120, 120, 120, 100] * 4
        out, acc, i = {}, 0, 0
        while acc < total:
            n = min(sizes[i % len(sizes)] << 20, total - acc)
            out["layer.%d" % i] = torch.empty(n // 4).uniform_(generator=g)
            acc += n
            i += 1
        return out
    if kind == "small":         # 420 KB each
        n = total // (420 << 10)
        return {"t.%d" % i: torch.empty(420 * 256).uniform_(generator=g) for i in range(n)}
    if kind == "odd":           # sizes that are not page multiples
        n = total // (420 << 10)
        return {"t.%d" % i: torch.empty(420 * 256 - 3 * (i % 7)).uniform_(generator=g)
                for i in range(n)}
    if kind in ("llama22", "small5000", "mixed", "tiny50000", "one22"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import save_bench
        if kind == "one22":     # the control: ONE uint8 tensor of llama22's bytes
            return {"x": torch.ones(nbytes_of(save_bench.llama22(mb / 2200)), dtype=torch.uint8)}
        return save_bench.MAKERS[kind](mb / 2200)
    if kind.startswith("llama"):  # checkpoint_bench's Llama + AdamW state
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import checkpoint_bench
        return checkpoint_bench.llama_adamw(mb / 2140)
    raise SystemExit("unknown state " + kind)


def nbytes_of(obj):
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(nbytes_of(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes_of(v) for v in obj)
    return 0


class Split:
    def __init__(self):
        self.t = {}

    def wrap(self, mod, name, label=None):
        fn = getattr(mod, name)
        label = label or name

        def w(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.t[label] = self.t.get(label, 0.0) + time.perf_counter() - t0
        setattr(mod, name, w)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--state", default="big")
    ap.add_argument("--mb", type=int, default=800)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--spare", action="store_true")
    ap.add_argument("--split", action="store_true")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--replace", action="store_true",
                    help="replace the previous file (as the benchmark does), not unlink it first")
    ap.add_argument("--same", action="store_true", help="every state saves to one path")
    ap.add_argument("--load", action="store_true", help="also time nvio.load")
    ap.add_argument("--what", default="save", help="save | safetensors | async")
    ap.add_argument("--set", action="append", default=[],
                    help="MODULE.NAME=VALUE: set a constant of nvio.checkpoint.MODULE (diagnosis)")
    a = ap.parse_args()
    import importlib
    for kv in a.set:
        name, val = kv.split("=")
        mod, attr = name.rsplit(".", 1)
        setattr(importlib.import_module("nvio.checkpoint." + mod), attr, eval(val))
    states = {k: make_state(k, a.mb) for k in a.state.split(",")}
    split = Split()
    if a.split:
        from nvio.checkpoint import _save
        split.wrap(_save, "Plan")
        split.wrap(_save, "write_packed")
        split.wrap(_save, "write_plans")
        split.wrap(_save, "reserve_space")
    for r, kind in [(r, k) for r in range(a.rounds) for k in states]:
        state = states[kind]
        nbytes = nbytes_of(state)
        path = os.path.join(a.dir, "h6diag-%s.pt" % ("same" if a.same else kind))
        if not a.spare and not a.replace and os.path.exists(path):
            os.unlink(path)
        split.t.clear()
        t0 = time.perf_counter()
        c0 = os.times()
        if a.what == "save":
            nvio.save(state, path, spare=a.spare)
        elif a.what == "safetensors":
            import nvio.safetensors as st
            st.save_file(state, path)
        elif a.what == "async":
            from nvio.checkpoint import async_save
            fut = async_save(state, path)
            tr = time.perf_counter() - t0
            fut.result()
            print("async return %.3fs" % tr)
        dt = time.perf_counter() - t0
        c1 = os.times()
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        print("%s %s %d tensors %.0f MB: %.3fs %.2f GB/s cpu %.2fs %s" % (
            kind, "spare" if a.spare else "new", len(state), nbytes / 1e6, dt,
            nbytes / dt / 1e9, cpu,
            " ".join("%s=%.3f" % kv for kv in split.t.items())), flush=True)
        if a.load:
            os.system("sync; echo 1 > /proc/sys/vm/drop_caches")
            t0 = time.perf_counter()
            nvio.load(path)
            dt = time.perf_counter() - t0
            print("  load %.3fs %.2f GB/s" % (dt, nbytes / dt / 1e9), flush=True)
        if not a.keep and not a.spare and r == a.rounds - 1 and os.path.exists(path):
            os.unlink(path)


if __name__ == "__main__":
    main()
