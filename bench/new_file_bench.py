#!/usr/bin/env python3
"""bench/new_file_bench.py - a 2 GiB write into a NEW file (what every save
does: a temporary, fsync, rename) from memory in 4 KiB pages and in huge
pages: nvio sending the caller's pages direct, nvio staging them through its
huge-page bounce buffers (NVIO_STAGE_SMALL_PAGES, src/pages.c), and fio
writing a new file from huge-page and from 4 KiB-page buffers, in
interleaved rotated rounds (../shared/BENCHMARKING.md). Page cache dropped
before every run; every write ends with fsync; GB/s = bytes / wall time of
the whole write (fio: its own process wall time, so its start-up counts).

    sudo python3 bench/new_file_bench.py --dir /var/tmp/nvio-nf --rounds 3 --out X.md
"""
import argparse
import datetime
import mmap
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
MiB = 1 << 20


def drop():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def anon(n, huge):
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    mv = memoryview(m)
    for i in range(0, n, MiB):
        mv[i:i + 1] = b"x"
    return m, mv


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/var/tmp/nvio-nf")
    ap.add_argument("--gib", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    import argparse as _ap
    import core_bench
    import hugepages
    import nvio
    from nvio import _nvio
    n = a.gib << 30
    os.makedirs(a.dir, exist_ok=True)
    load0 = os.getloadavg()[0]
    _, small = anon(n, False)
    _, huge = anon(n, True)
    piece = 11 * MiB                     # tensor-like pieces, not block multiples
    p4 = [small[i:i + piece] for i in range(0, n, piece)]
    ph = [huge[i:i + piece] for i in range(0, n, piece)]
    h = nvio.AioHandle(block_size=8 * MiB, queue_depth=32, intra_op_parallelism=4)
    path = os.path.join(a.dir, "nvio.bin")

    def nv(pieces, stage):
        os.environ["NVIO_STAGE_SMALL_PAGES"] = stage
        if os.path.exists(path):
            os.unlink(path)
        drop()
        t = time.perf_counter()
        with h.open(path, _nvio.FILE_ATOMIC) as f:
            f.allocate(0, n)
            f.pwritev(pieces, 0)
            f.commit()
        return n / (time.perf_counter() - t) / 1e9

    fio = core_bench.Bench.__new__(core_bench.Bench)
    fio.args = _ap.Namespace(quick=False)
    fio.log = lambda *x: None
    fpath = os.path.join(a.dir, "fio.bin")

    def fio_new(huge_pages):
        best = 0
        for c in (dict(engine="libaio", block=MiB, qd=32, jobs=1, huge=huge_pages),
                  dict(engine="libaio", block=8 * MiB, qd=128, jobs=2, huge=huge_pages)):
            if os.path.exists(fpath):
                os.unlink(fpath)
            drop()
            best = max(best, fio.run_fio("write", fpath, n, c)["gbps"])
        return best

    cases = {"nvio 4K pages, auto (staged here)": lambda: nv(p4, "auto"),
             "nvio 4K pages, sent direct (=0)": lambda: nv(p4, "0"),
             "nvio huge pages, auto (direct)": lambda: nv(ph, "auto"),
             "fio-new huge pages": lambda: fio_new(1),
             "fio-new 4K pages": lambda: fio_new(0)}
    res = {k: [] for k in cases}
    t0 = time.time()
    with hugepages.reserved(8 * MiB * 128 * 2 + 64 * MiB, print) as fio.huge_path:
        for r in range(a.rounds):
            ks = list(cases)
            ks = ks[r % len(ks):] + ks[:r % len(ks)]
            for k in ks:
                res[k].append(cases[k]())
                print("round %d %s %.2f GB/s" % (r + 1, k, res[k][-1]), flush=True)
    os.environ.pop("NVIO_STAGE_SMALL_PAGES", None)
    for p in (path, fpath):
        if os.path.exists(p):
            os.unlink(p)
    ref = "fio-new huge pages"
    dev = subprocess.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "--target", a.dir],
                         capture_output=True, text=True).stdout.strip()
    lines = ["# Writing a new file from 4 KiB pages and from huge pages — %s" % datetime.date.today(),
             "",
             "- date: %s UTC; wall %.1f min" % (datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
                                               (time.time() - t0) / 60),
             "- machine: %d cores, kernel %s; load average %.2f at the start, %.2f at the end "
             "(above ~0.5: other jobs shared the machine)" % (
                 os.cpu_count(), platform.release(), load0, os.getloadavg()[0]),
             "- dir: %s (%s)" % (a.dir, dev),
             "- command: `%s`" % " ".join(shlex.quote(x) for x in sys.argv),
             "- nvio %s (git %s): AioHandle 8 MiB blocks, QD32, 4 workers; one pwritev of %d "
             "pieces of 11 MiB into an atomic file (allocate, write, fsync, rename)" % (
                 nvio.__version__, subprocess.run(["git", "-C", os.path.dirname(HERE), "rev-parse",
                                                   "--short", "HEAD"], capture_output=True,
                                                  text=True).stdout.strip(), len(p4)),
             "- fio-new: the better of libaio 1 MiB x QD32 x 1 job and 8 MiB x QD128 x 2 jobs, "
             "O_DIRECT, writing a file that does not exist (--fallocate=none), end_fsync",
             "- %d rounds, interleaved and rotated; page cache dropped before every run; "
             "ratios = median of per-round ratios" % a.rounds, "",
             "| contender | GB/s median | min–max | × %s | per round |" % ref,
             "|---|---:|---:|---:|---|"]
    for k, v in res.items():
        lines.append("| %s | %.2f | %.2f–%.2f | %.2f | %s |" % (
            k, statistics.median(v), min(v), max(v),
            statistics.median(x / y for x, y in zip(v, res[ref])), " ".join("%.2f" % x for x in v)))
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
