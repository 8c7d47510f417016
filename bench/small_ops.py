#!/usr/bin/env python3
"""Cost per call of small reads and writes from Python: nvio against the alternatives.

Many checkpoints hold thousands of small tensors, so what a call costs
besides the bytes matters. This measures microseconds per synchronous call
on a file in memory (tmpfs, /dev/shm by default), where the device costs
next to nothing and what is left is software: argument handling, opening
the file, system calls, threads.

Methods, each reading (or writing) SIZE bytes at a rotating offset:
  python-fd     os.preadv / os.pwritev on an open descriptor, a memoryview
  python-fd-tnp the same as a torch user must write it for a tensor t:
                os.preadv(fd, [t.numpy()], off), the NumPy view made per
                call (the tensor may have been resized or replaced since)
  python-fd-np  os.preadv(fd, [a], off) with a = t.numpy() made once
  python-path   open(path, buffering=0), seek, readinto/write, close
  nvio-fd       AioHandle(direct=False).sync_pread(t, fd) (the same writes)
  nvio-path     the same by path (nvio opens and closes the file)
  nvio-file     File.pread / File.pwrite on a file opened once
                (AioHandle(direct=False).open(path, FILE_READ | FILE_WRITE),
                libnvio 0.2's nvio_file_pread), torch tensor
  nvio-file-np  the same with a NumPy array
  nvio-file-mv  the same with a memoryview (the buffer os.preadv gets)
  nvio-np       nvio-path with a NumPy array instead of a torch tensor
  nvio-direct   AioHandle() (O_DIRECT where the file system has it), by path
  deepspeed     DeepSpeed's aio_handle().sync_pread / sync_pwrite by path
                (O_DIRECT), when `import deepspeed` works and its op builds

Buffers are page-aligned: torch tensors from each handle's
new_cpu_locked_tensor, a NumPy view of one for nvio-np, a
bytearray-free memoryview of the same memory for python. Rounds are
interleaved (the order rotates); the table reports the median of the
per-round medians in microseconds per call and the median of per-round
ratios to python-fd (a memoryview) and to python-fd-tnp (the torch user's
os.preadv). Issue 15's target: File.pread <= 1.5x os.preadv.

    python bench/small_ops.py                          # 4K, 64K, 1M in /dev/shm
    python bench/small_ops.py --dir /mnt/nvme --sizes 4K --calls 5000
"""
import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

try:
    import nvio
except ImportError:  # run from a source tree after build_ext --inplace
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import nvio

from py_load_store import parse_size  # bench/py_load_store.py

FILE_BYTES = 64 << 20


def human(n):
    for unit, b in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= b and n % b == 0:
            return "%d%s" % (n // b, unit)
    return str(n)


def load_deepspeed():
    try:
        from deepspeed.ops.op_builder import AsyncIOBuilder
        return AsyncIOBuilder().load(verbose=False).aio_handle()
    except Exception as e:  # not installed, or its op does not build
        print("deepspeed: not used (%s)" % str(e).splitlines()[0][:100], file=sys.stderr)
        return None


def make_methods(size, path, fd, ds):
    plain = nvio.AioHandle(direct=False)
    direct = nvio.AioHandle()
    t = plain.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
    td = direct.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
    a = t.numpy()
    mv = memoryview(a)
    f = plain.open(path, nvio.FILE_READ | nvio.FILE_WRITE) if hasattr(plain, "open") else None
    m = {
        "python-fd": (lambda off: os.preadv(fd, [mv], off),
                      lambda off: os.pwritev(fd, [mv], off)),
        "python-fd-tnp": (lambda off: os.preadv(fd, [t.numpy()], off),
                          lambda off: os.pwritev(fd, [t.numpy()], off)),
        "python-fd-np": (lambda off: os.preadv(fd, [a], off),
                         lambda off: os.pwritev(fd, [a], off)),
        "python-path": (lambda off: py_path(path, off, mv, False),
                        lambda off: py_path(path, off, mv, True)),
        "nvio-fd": (lambda off: plain.sync_pread(t, fd, off),
                    lambda off: plain.sync_pwrite(t, fd, off)),
        "nvio-path": (lambda off: plain.sync_pread(t, path, off),
                      lambda off: plain.sync_pwrite(t, path, off)),
        "nvio-np": (lambda off: plain.sync_pread(a, path, off),
                    lambda off: plain.sync_pwrite(a, path, off)),
        "nvio-direct": (lambda off: direct.sync_pread(td, path, off),
                        lambda off: direct.sync_pwrite(td, path, off)),
    }
    if f is not None:
        m["nvio-file"] = (lambda off: f.pread(t, off), lambda off: f.pwrite(t, off))
        m["nvio-file-np"] = (lambda off: f.pread(a, off), lambda off: f.pwrite(a, off))
        m["nvio-file-mv"] = (lambda off: f.pread(mv, off), lambda off: f.pwrite(mv, off))
    if ds is not None:
        tds = ds.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
        m["deepspeed"] = (lambda off: ds.sync_pread(tds, path, off),
                          lambda off: ds.sync_pwrite(tds, path, off))
    keep = (plain, direct, t, td, a, mv, f) + ((tds,) if ds is not None else ())
    return m, keep


def py_path(path, off, mv, write):
    with open(path, "r+b" if write else "rb", buffering=0) as f:
        f.seek(off)
        return f.write(mv) if write else f.readinto(mv)


def uptime():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def time_calls(fn, offsets, cpu=None):
    """Mean wall microseconds per call; the thread's CPU microseconds per
    call are appended to cpu (a list) when given."""
    c0 = time.thread_time()
    t0 = time.perf_counter()
    for off in offsets:
        fn(off)
    t1 = time.perf_counter()
    if cpu is not None:
        cpu.append((time.thread_time() - c0) / len(offsets) * 1e6)
    return (t1 - t0) / len(offsets) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--sizes", default="4K,64K,1M")
    ap.add_argument("--calls", type=int, default=2000, help="calls per method per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-deepspeed", action="store_true")
    ap.add_argument("--methods", help="comma list: only these (python-fd and python-fd-tnp "
                    "are always run, as the bases of the ratios)")
    ap.add_argument("--out", help="write the markdown report here too")
    a = ap.parse_args()

    path = os.path.join(a.dir, "nvio-small-ops.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(FILE_BYTES))
    fd = os.open(path, os.O_RDWR)
    ds = None if a.no_deepspeed else load_deepspeed()
    lines = []
    loads = [uptime()]
    try:
        for size in map(parse_size, a.sizes.split(",")):
            methods, keep = make_methods(size, path, fd, ds)
            names = list(methods)
            if a.methods:
                want = set(a.methods.split(",")) | {"python-fd", "python-fd-tnp"}
                names = [n for n in names if n in want]
            nslots = FILE_BYTES // size
            offsets = [(i * 7919 % nslots) * size for i in range(a.calls)]
            for op in (0, 1):
                per = {n: [] for n in names}
                cpu = {n: [] for n in names}
                for n in names:  # warm up: first-use costs are not per call
                    time_calls(methods[n][op], offsets[:50])
                for r in range(a.rounds):
                    order = names[r % len(names):] + names[:r % len(names)]
                    for n in order:
                        per[n].append(time_calls(methods[n][op], offsets, cpu[n]))
                def ratio(a, b):
                    return statistics.median(x / y for x, y in zip(a, b))

                for n in names:
                    lines.append((human(size), ("read", "write")[op], n,
                                  statistics.median(per[n]),
                                  ratio(per[n], per["python-fd"]),
                                  ratio(per[n], per["python-fd-tnp"]),
                                  statistics.median(cpu[n]),
                                  ratio(cpu[n], cpu["python-fd"]),
                                  ratio(cpu[n], cpu["python-fd-tnp"]),
                                  " ".join("%.2f" % x for x in per[n])))
                    print("%5s %-5s %-13s %8.2f us  x%.2f  x%.2f  cpu %.2f x%.2f x%.2f  %s" %
                          lines[-1], file=sys.stderr)
                loads.append(uptime())
            del keep
    finally:
        os.close(fd)
        os.unlink(path)

    fs = subprocess.run(["stat", "-f", "-c", "%T", a.dir], capture_output=True, text=True).stdout.strip()
    out = ["# nvio small-op cost, Python — %s" % datetime.date.today(), "",
           "- date: %s" % datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
           "- machine: %d cores, %s, kernel %s" % (os.cpu_count(), platform.processor() or platform.machine(),
                                                 platform.release()),
           "- nvio %s; torch %s; Python %s; DeepSpeed %s" % (
               nvio.__version__, torch.__version__, platform.python_version(),
               "used" if ds is not None else "not used"),
           "- file: %s (%s), %d MiB, page cache warm" % (a.dir, fs, FILE_BYTES >> 20),
           "- command: `%s`" % " ".join(["bench/small_ops.py"] + sys.argv[1:]),
           "- load average at the start and after each size and op: %s" % "; ".join(loads),
           "- %d calls per method per round, %d interleaved rounds; us = median of the "
           "per-round means; ratios = median of per-round ratios to python-fd "
           "(os.preadv on a memoryview) and to python-fd-tnp (os.preadv on t.numpy(), the "
           "view made per call); CPU = the thread's CPU time per call (time.thread_time), "
           "steadier than wall time on a shared machine, its ratios likewise" % (a.calls, a.rounds),
           "", "| size | op | method | us per call | × python-fd | × python-fd-tnp | CPU us "
           "| CPU × python-fd | CPU × python-fd-tnp | per-round us |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    out += ["| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |" % l for l in lines]
    text = "\n".join(out) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
