#!/usr/bin/env python3
"""bench/save_ab.py - nvio.save against itself: the writer of another commit,
or another path, on the same state, the same file and the same disk, in
interleaved rotated rounds (../shared/BENCHMARKING.md), with fio on the
very blocks a spare save writes as the yardstick. Appends a markdown
section (machine, command, date, medians with min-max) to --out.

Variants (comma-separated, --variants):

  current      nvio.save as it is
  pack         nvio.save forced through the windows (_base.plan.write_images)
  direct       nvio.save forced straight from the tensors (_base.plan.write_plans)
  rev:REV      nvio.save with python/nvio/checkpoint/_save.py of git commit REV
               (loaded beside the current package: the base it imports must
               still have the names it uses)
  fio          fio overwriting the spare's blocks (--spare) or writing a new
               file, the better of bench/checkpoint_bench.py's two configs,
               huge-page buffers
  dcp          torch.distributed.checkpoint.save(sd, storage_writer=
               nvio.dcp.FileSystemWriter(d)), into a directory removed first
               (untimed); new files only
  dcp-wrapper  nvio.dcp.save(sd, checkpoint_id=d): the same writer with the
               cyclic collector paused for the call

No collection is forced between runs (save_bench.py collects before each
timed save so that rounds are alike): the collector starts when the
process's own history says so, as in a training job. That is what the
dcp/dcp-wrapper pair measures: DCP's planning of thousands of items starts
a full collection in some saves and not in others.

    python3 bench/save_ab.py --dir /var/tmp --state llama22 --spare \\
        --variants current,rev:e2fa4a8~1,fio --rounds 5 --out bench/results/X.md

Needs root (drop_caches, hugetlbfs); pauses free-page reporting.
"""
import argparse
import contextlib
import functools
import importlib.util
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import checkpoint_bench as cb  # noqa: E402
import core_bench  # noqa: E402
import guestmem  # noqa: E402
import hugepages  # noqa: E402
import ramdisk  # noqa: E402
import save_bench as sb  # noqa: E402

import torch.distributed.checkpoint as dcp  # noqa: E402

import nvio  # noqa: E402
import nvio.dcp  # noqa: E402
from nvio.checkpoint import _save  # noqa: E402

MiB = 1 << 20
REPO = os.path.dirname(HERE)


def load_rev(rev):
    """checkpoint/_save.py of commit rev as a module of the current package."""
    src = subprocess.run(["git", "-C", REPO, "show", "%s:python/nvio/checkpoint/_save.py" % rev],
                         check=True, capture_output=True, text=True).stdout
    name = "nvio.checkpoint._save_at_%d" % abs(hash(rev))
    spec = importlib.util.spec_from_loader(name, loader=None, origin="git:" + rev)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "nvio.checkpoint"
    sys.modules[name] = mod
    exec(compile(src, "%s:_save.py" % rev, "exec"), mod.__dict__)
    return mod


def dcp_save(sd, d):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # no process group: one process
        dcp.save(sd, storage_writer=nvio.dcp.FileSystemWriter(d))


def dcp_wrapper(sd, d):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nvio.dcp.save(sd, checkpoint_id=d)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/var/tmp/nvio-save-ab")
    ap.add_argument("--state", default="llama22", choices=["llama22", "small5000", "mixed",
                                                           "tiny50000"])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--spare", action="store_true", help="spare saves (default: new files)")
    ap.add_argument("--variants", default="current,fio")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--settle", type=float, default=1.0,
                    help="seconds to wait before each run (default 1), so that the "
                    "file the previous run replaced is freed before this run, not "
                    "during it (without it, new-file rounds ranked two writers "
                    "the other way round than alternating with a pause did)")
    ap.add_argument("--ram", choices=["xfs", "ext4"],
                    help="a RAM-backed file system (bench/ramdisk.py) instead of --dir")
    ap.add_argument("--out")
    a = ap.parse_args()
    with contextlib.ExitStack() as stack:
        if a.ram:
            a.dir = stack.enter_context(ramdisk.mounted("12G", None, fs=a.ram, name="ab"))
        run(a)


def run(a):
    os.makedirs(a.dir, exist_ok=True)
    p = os.path.join(a.dir, "ab.pt")
    spare = os.path.join(a.dir, ".ab.pt.nvio-spare")
    variants = a.variants.split(",")
    fns = {}
    for v in variants:
        if v == "current":
            fns[v] = _save.save
        elif v in ("pack", "direct"):
            fns[v] = v
        elif v in ("dcp", "dcp-wrapper"):
            if a.spare:
                sys.exit("save_ab.py: %s writes new files only (no --spare)" % v)
            fns[v] = v
        elif v.startswith("rev:"):
            fns[v] = load_rev(v[4:]).save
        elif v != "fio":
            sys.exit("save_ab.py: unknown variant %r" % v)
    fio = core_bench.Bench.__new__(core_bench.Bench)
    fio.args = argparse.Namespace(quick=False)
    fio.log = lambda *x: None
    load0 = os.getloadavg()[0]
    res = {v: [] for v in variants}
    cpu = {v: [] for v in variants}
    with guestmem.page_reporting_paused(True), \
            hugepages.reserved(8 * MiB * 128 + 64 * MiB, lambda *x: None) as fio.huge_path:
        sd = getattr(sb, a.state)(a.scale)
        nb = sum(s.nbytes() for s in cb.storages(sd))
        nvio.save(sd, p, spare=True)
        nvio.save(sd, p, spare=True)            # the spare is there
        packs = _save._packs
        for r in range(a.rounds):
            for v in variants[r % len(variants):] + variants[:r % len(variants)]:
                time.sleep(a.settle)
                if v == "fio":
                    target = spare if a.spare else os.path.join(a.dir, "fio-new")
                    best = 0.0
                    for c in cb.FIO_CFGS:
                        if not a.spare and os.path.exists(target):
                            os.unlink(target)
                        best = max(best, fio.run_fio("write", target, nb // (16 * MiB) * (16 * MiB),
                                                     c)["gbps"])
                    if not a.spare:
                        os.unlink(target)
                    res[v].append(best)
                    continue
                fn = fns[v]
                d = os.path.join(a.dir, "ab-dcp")
                if fn in ("dcp", "dcp-wrapper"):
                    shutil.rmtree(d, ignore_errors=True)      # a new directory, untimed
                    call = functools.partial(dcp_save if fn == "dcp" else dcp_wrapper, sd, d)
                else:
                    if fn in ("pack", "direct"):
                        _save._packs = (lambda plan: True) if fn == "pack" else \
                            (lambda plan: False)
                        fn = _save.save
                    call = functools.partial(fn, sd, p, spare=a.spare)
                try:
                    core_bench.drop_caches()
                    c0, t0 = os.times(), time.perf_counter()
                    call()
                    res[v].append(nb / (time.perf_counter() - t0) / 1e9)
                    c1 = os.times()
                    cpu[v].append((c1.user - c0.user + c1.system - c0.system) / (nb / 1e9))
                finally:
                    _save._packs = packs
                    shutil.rmtree(d, ignore_errors=True)
        for x in (p, spare):
            if os.path.exists(x):
                os.unlink(x)
    head = subprocess.run(["git", "-C", REPO, "log", "--oneline", "-1"],
                          capture_output=True, text=True).stdout.strip()
    lines = ["## %s, %s saves, scale %g — %s" % (a.state, "spare" if a.spare else "new-file",
                                                 a.scale, time.strftime("%Y-%m-%d %H:%M UTC",
                                                                        time.gmtime())),
             "",
             "- machine: %s, %d cores; %s; nvio %s at %s" % (
                 platform.node() or "vm", os.cpu_count(),
                 "RAM-backed %s (bench/ramdisk.py)" % a.ram if a.ram else "disk under " + a.dir,
                 nvio.__version__, head),
             "- command: `python3 bench/save_ab.py %s`" % " ".join(sys.argv[1:]),
             "- %d rounds, interleaved and rotated; %g s pause, then page cache dropped "
             "before each save; "
             "free-page reporting paused; load average %.2f at the start, %.2f at the end"
             % (a.rounds, a.settle, load0, os.getloadavg()[0]),
             "",
             "",
             "CPU s/GB: user + system time of the whole process (every thread) per GB saved.",
             "",
             "| variant | GB/s median | min–max | × first | CPU s/GB | per round |",
             "|---|---:|---:|---:|---:|---|"]
    first = statistics.median(res[variants[0]])
    for v in variants:
        m = statistics.median(res[v])
        lines.append("| %s | %.2f | %.2f–%.2f | %.2f | %s | %s |" % (
            v, m, min(res[v]), max(res[v]), m / first,
            "%.3f" % statistics.median(cpu[v]) if cpu[v] else "·",
            " ".join("%.2f" % x for x in res[v])))
    core_bench.emit(lines, a.out, append=True)


if __name__ == "__main__":
    main()
