#!/usr/bin/env python3
"""bench/window_copy.py - what copying costs the device: the packed writer's
pattern without its CRC or zip work.

A file (FILE, at least --gb GB, written over in place) is written in windows
of --window MiB from page-locked buffers, --windows of them in flight, with
the handle nvio.save uses; each window either goes out as it is ("none") or
is first filled by a copy from another buffer, by one thread ("1 thread") or
by the caller and a CRC-pool thread side by side ("2 threads", as the packed
writer copies). Rounds interleaved, page cache dropped before each run;
medians with min-max, as markdown (--out appends).

    python3 bench/window_copy.py /var/tmp/nvio-savebench/f.bin --gb 2 --rounds 5

The question it answers (issue 33): how much of the gap between a packed
save of many small tensors and fio is the copy the packed writer cannot
avoid (torch's 64-byte-aligned tensors need one for O_DIRECT), rather than
nvio's own work.
"""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
import core_bench  # noqa: E402

from nvio import _nvio  # noqa: E402
from nvio._base.crc import executor  # noqa: E402
from nvio._base.handle import default_handle  # noqa: E402

MiB = 1 << 20


def run(path, size, window, nwin, copiers, src):
    bufs = [_nvio.LockedBuffer(window) for _ in range(nwin)]
    ex = executor()
    half = window // 2
    core_bench.drop_caches()
    with default_handle().open(path, _nvio.FILE_WRITE) as f:
        futs = {}
        t0 = time.perf_counter()
        for k, off in enumerate(range(0, size, window)):
            s = k % nwin
            if s in futs:
                futs.pop(s).result()
            b = bufs[s].address
            if copiers == 1:
                _nvio.copy_many([(b, src.address, window)])
            elif copiers == 2:
                other = ex.submit(_nvio.copy_many, [(b + half, src.address + half, window - half)])
                _nvio.copy_many([(b, src.address, half)])
                other.result()
            futs[s] = f.pwrite_async(memoryview(bufs[s]), off)
        for x in futs.values():
            x.result()
        t1 = time.perf_counter()
    return size / (t1 - t0) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--window", type=int, default=32, help="MiB")
    ap.add_argument("--windows", default="2,4", help="windows in flight, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    window = a.window * MiB
    size = int(a.gb * 1e9) // window * window
    fresh = not os.path.exists(a.file) or os.path.getsize(a.file) < size
    if fresh:
        fd = os.open(a.file, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
    src = _nvio.LockedBuffer(window)
    memoryview(src)[:] = os.urandom(window)
    if fresh:                       # every block written once: then written over
        run(a.file, size, window, 2, 0, src)
    cfgs = [(n, c) for n in map(int, a.windows.split(",")) for c in (0, 1, 2)]
    res = {c: [] for c in cfgs}
    load0 = os.getloadavg()[0]
    for r in range(a.rounds):
        for c in cfgs[r % len(cfgs):] + cfgs[:r % len(cfgs)]:
            res[c].append(run(a.file, size, window, c[0], c[1], src))
    head = subprocess.run(["git", "-C", os.path.join(HERE, ".."), "log", "--oneline", "-1"],
                          capture_output=True, text=True).stdout.strip()
    h = default_handle()
    names = {0: "none", 1: "1 thread", 2: "2 threads"}
    lines = ["## Windows written with and without a copy first — %s" %
             time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "",
             "- machine: %s, %d cores; file %s (%.2f GB written over in place); nvio at %s"
             % (platform.node() or "vm", os.cpu_count(), a.file, size / 1e9, head),
             "- handle: engine %s, block %d MiB, queue depth %d; windows of %d MiB"
             % (h.get_engine(), h.get_block_size() // MiB, h.get_queue_depth(), a.window),
             "- command: `python3 bench/window_copy.py %s`" % " ".join(sys.argv[1:]),
             "- %d rounds, interleaved and rotated; page cache dropped before each run; "
             "load average %.2f at the start, %.2f at the end"
             % (a.rounds, load0, os.getloadavg()[0]), "",
             "| windows in flight | copy before each write | GB/s median | min–max | "
             "× no copy | per round |", "|---:|---|---:|---:|---:|---|"]
    for n, c in cfgs:
        med = statistics.median(res[(n, c)])
        base = statistics.median(res[(n, 0)])
        lines.append("| %d | %s | %.2f | %.2f–%.2f | %.2f | %s |" % (
            n, names[c], med, min(res[(n, c)]), max(res[(n, c)]), med / base,
            " ".join("%.2f" % x for x in res[(n, c)])))
    core_bench.emit(lines, a.out, append=True)


if __name__ == "__main__":
    main()
