#!/usr/bin/env python3
"""Where a save of many tensors spends its time in Python (issue 33).

    python3 bench/many_tensors.py [--tiny 50000] [--dcp 5000] [--rounds 3] \
        [--dir /var/tmp] [--out bench/results/....md]

Interleaved rounds, medians (min-max), page cache not dropped: these are
CPU costs, not the device's (save_bench.py measures against fio).

- tiny: a state of N tensors of 1-1024 fp32 elements (~100 MB for 50,000):
  a floor that any writer of torch.save's format from Python pays (reading
  each tensor's size, stride, offset and storage; CPython's pickler writing
  one plain tuple per tensor), nvio's pickling alone (``_Pickler.dump``),
  its Plan (pickle and layout), ``nvio.save`` and ``torch.save`` (+ fsync)
  of the state to a new file, and ``async_save``'s call. The other state
  stays alive meanwhile (as in a training process, collections walk it).
- dcp: ``dcp.save`` of M tensors of 420 KB through ``nvio.dcp``'s writer and
  torch's FileSystemWriter, each into a new directory.
"""
from __future__ import annotations

import argparse
import datetime
import io
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import nvio  # noqa: E402
import nvio.dcp  # noqa: E402
from nvio._base import plan as _plan  # noqa: E402


def tiny_state(n):
    g = torch.Generator().manual_seed(0)
    sizes = torch.randint(1, 1025, (n,), generator=g).tolist()
    return {"t%d" % i: torch.randn(k, generator=g) for i, k in enumerate(sizes)}


def floor_reads(sd):
    """Reading what torch's reduction needs of each tensor."""
    for t in sd.values():
        t.untyped_storage(), t.storage_offset(), t.size(), t.stride(), t.requires_grad


def floor_pickle(rows):
    """CPython's pickler writing one (offset, size, stride, requires_grad)
    tuple per tensor: no persistent ids, no rebuild functions."""
    pickle.dumps(rows, 2)


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def fmt(xs):
    return "%.3f (%.3f–%.3f)" % (statistics.median(xs), min(xs), max(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", type=int, default=50000)
    ap.add_argument("--dcp", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--out")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    import torch.distributed.checkpoint as dcp

    d = tempfile.mkdtemp(prefix="nvio-many-", dir=a.dir)
    sd = tiny_state(a.tiny)
    rows = [(t.storage_offset(), tuple(t.size()), t.stride(), t.requires_grad)
            for t in sd.values()]
    big = {"t%d" % i: torch.randn(105000) for i in range(a.dcp)}
    p = os.path.join(d, "tiny.pt")

    def new(fn):
        def run():
            if os.path.exists(p):
                os.unlink(p)
            fn()
        return run

    def pickle_only():
        with _plan.gc_paused():
            _plan._Pickler(io.BytesIO(), 2, {}).dump(sd)

    def torch_save():
        with open(p, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())

    def dcp_with(writer):
        def run():
            dd = os.path.join(d, "dcp")
            shutil.rmtree(dd, ignore_errors=True)
            os.makedirs(dd)
            dcp.save(big, storage_writer=writer(dd), no_dist=True)
        return run

    tiny_rows = [
        ("floor: read size/stride/offset/storage", lambda: floor_reads(sd)),
        ("floor: pickle the reduction tuples", lambda: floor_pickle(rows)),
        ("nvio pickling (_Pickler.dump, collector paused as in Plan)", pickle_only),
        ("nvio Plan (pickle + layout)", lambda: _plan.Plan(sd, p)),
        ("nvio.save, new file", new(lambda: nvio.save(sd, p))),
        ("torch.save + fsync, new file", new(torch_save)),
    ]
    dcp_rows = [
        ("nvio.dcp FileSystemWriter", dcp_with(nvio.dcp.FileSystemWriter)),
        ("torch FileSystemWriter", dcp_with(dcp.FileSystemWriter)),
    ]
    res = {name: [] for name, _ in tiny_rows + dcp_rows}
    res["async_save call"] = []
    for name, fn in tiny_rows + dcp_rows:      # warm
        fn()
    for _ in range(a.rounds):
        for name, fn in tiny_rows:
            res[name].append(timed(fn))
        if os.path.exists(p):
            os.unlink(p)
        t = time.perf_counter()
        fut = nvio.async_save(sd, p)
        res["async_save call"].append(time.perf_counter() - t)
        fut.result()
        for name, fn in dcp_rows:
            res[name].append(timed(fn))
    shutil.rmtree(d, ignore_errors=True)

    mb = sum(t.nbytes for t in sd.values()) / 1e6
    git = ""
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=os.path.dirname(os.path.abspath(__file__))
                             ).stdout.strip()
    except OSError:
        pass
    head = ["# Many tensors: where the time goes in Python", "",
            "- date: %s; machine: %s, %d CPUs, Python %s, torch %s; nvio at %s" % (
                datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), platform.machine(),
                os.cpu_count(), platform.python_version(), torch.__version__, git),
            "- command: `python3 bench/many_tensors.py --tiny %d --dcp %d --rounds %d "
            "--dir %s`" % (a.tiny, a.dcp, a.rounds, a.dir),
            "- seconds, median (min–max) of %d interleaved rounds; page cache not dropped"
            % a.rounds, ""]
    out = head + ["## %d tensors of 1–1024 fp32 elements (%.0f MB)" % (a.tiny, mb), "",
                  "| step | seconds |", "|---|---:|"]
    for name, _ in tiny_rows:
        out.append("| %s | %s |" % (name, fmt(res[name])))
    out.append("| async_save call | %s |" % fmt(res["async_save call"]))
    out += ["", "## dcp.save of %d tensors of 420 KB (%.1f GB), new directory" % (
        a.dcp, a.dcp * 420000 / 1e9), "", "| writer | seconds |", "|---|---:|"]
    for name, _ in dcp_rows:
        out.append("| %s | %s |" % (name, fmt(res[name])))
    text = "\n".join(out) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
