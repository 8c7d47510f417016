#!/usr/bin/env python3
"""bench/ram_ceiling.py - what fio's fast 2-job RAM-disk writes do.

The open question (2026-11-22): on the RAM disk, fio with 2 jobs (libaio,
8 MiB, QD128) sometimes wrote 1 GiB at 8.8-9.1 GB/s while nvio's best
stayed at 5.9-6.4 GB/s in the same rounds. This runs, interleaved and
rotated, on a fresh RAM disk (bench/ramdisk.sh) and one preallocated 1 GiB
file overwritten in place (as core_bench.py does):

  fio-2j        libaio 8M x QD128, 2 jobs of 512 MiB (--offset_increment)
  fio-2j-huge   the same with --mem=mmaphuge buffers
  fio-1j        libaio 8M x QD128, 1 job of 1 GiB
  nvio-best     8M:128:2:libaio (core_bench's RAM winner), locked buffer
  nvio-default  nvio_config_init(), locked buffer

writes ending with fsync (fio --end_fsync=1, nvio NVIO_FSYNC), caches dropped
before each run. For fio it records three figures: fio's own (bytes over
the longest job's runtime, what results before 2026-11-21f used), the span
(first job's first I/O to last job's end, from latency logs, what
core_bench.py uses now) and the wall time of the fio process; the jobs'
start and end times and the lowest and highest offset each job wrote (from
--log_offset=1), to see whether they overlap in time and in the file.
Also: the loop device's direct-io and the tmpfs's memory (Shmem) before
and after each run (new tmpfs pages mean the "device" is allocating).

    python3 bench/ram_ceiling.py --rounds 7 --out bench/results/x.md
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import core_bench  # noqa: E402
import guestmem  # noqa: E402
import hugepages  # noqa: E402
import ramdisk  # noqa: E402

MiB = 1 << 20
SIZE = 1 << 30


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def run_fio(path, jobs, huge_path):
    per = SIZE // jobs
    logdir = tempfile.mkdtemp(prefix="nvio-fio-")
    cmd = ["fio", "--name=core", "--filename=" + path, "--rw=write", "--bs=8M",
           "--iodepth=128", "--ioengine=libaio", "--direct=1", "--numjobs=%d" % jobs,
           "--size=%d" % per, "--offset_increment=%d" % per, "--fallocate=none",
           "--invalidate=1", "--end_fsync=1", "--output-format=json",
           "--write_lat_log=" + os.path.join(logdir, "j"), "--log_unix_epoch=1",
           "--log_offset=1"]
    if huge_path:
        cmd.append("--mem=mmaphuge:" + huge_path)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.time() - t0
    j = json.loads(p.stdout[p.stdout.index("{"):])
    jobs_out = []
    for k, job in enumerate(j["jobs"], 1):
        first = None
        lo, hi = None, 0
        with open(os.path.join(logdir, "j_lat.%d.log" % k)) as f:
            for line in f:
                c = [x.strip() for x in line.split(",")]
                t = int(c[0]) / 1e3 - int(c[1]) / 1e9
                first = t if first is None else min(first, t)
                off = int(c[4])
                lo = off if lo is None else min(lo, off)
                hi = max(hi, off + int(c[3]))
        rt = job["write"]["runtime"] / 1000.0
        jobs_out.append(dict(start=first, end=first + rt, runtime=rt, lo=lo, hi=hi,
                             bytes=job["write"]["io_bytes"]))
    shutil.rmtree(logdir, ignore_errors=True)
    nbytes = sum(x["bytes"] for x in jobs_out)
    span = max(x["end"] for x in jobs_out) - min(x["start"] for x in jobs_out)
    own = nbytes / max(x["runtime"] for x in jobs_out) / 1e9
    return dict(gbps=nbytes / span / 1e9, own=own, wall=nbytes / wall / 1e9, jobs=jobs_out,
                t0=t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "libnvio.a"))
    ap.add_argument("--out")
    a = ap.parse_args()

    exe = "/tmp/nvio-ram-xfer"
    libs = subprocess.run(["make", "-s", "-C", REPO, "print-libs"], capture_output=True,
                          text=True, check=True).stdout.split()
    subprocess.run(["cc", "-O2", "-I" + os.path.join(REPO, "include"),
                    os.path.join(HERE, "nvio_xfer.c"), a.lib, "-o", exe] + libs, check=True)
    import signal
    signal.signal(signal.SIGTERM, lambda *x: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *x: sys.exit(129))
    notes = []
    # the server holding its file there stops (finally) before the disk goes
    with ramdisk.mounted("4G", notes.append) as mnt:
        srv = None
        per = {}
        try:
            with guestmem.page_reporting_paused(True) as guest, \
                    hugepages.reserved(8 * MiB * 128 + 64 * MiB, lambda m: None) as huge:
                notes.append(guest["note"])
                dev = subprocess.run(["findmnt", "-n", "-o", "SOURCE", mnt], capture_output=True,
                                     text=True).stdout.strip()
                name = os.path.basename(dev)
                for f in ("loop/dio", "queue/max_sectors_kb", "queue/max_segments",
                          "queue/rotational"):
                    try:
                        notes.append("%s %s: %s" % (dev, f, open("/sys/block/%s/%s" % (name, f))
                                                    .read().strip()))
                    except OSError:
                        pass
                path = os.path.join(mnt, "nvio-ram-ceiling")
                with open(path, "wb") as f:
                    for _ in range(SIZE // (64 * MiB)):
                        f.write(b"\x5a" * (64 * MiB))
                    os.fsync(f.fileno())
                srv = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True, bufsize=1)

                def nvio(cfg):
                    srv.stdin.write("run write locked %s %d 0 %s\n" % (path, SIZE, cfg))
                    srv.stdin.flush()
                    r = json.loads(srv.stdout.readline())
                    if not r["ok"]:
                        raise RuntimeError(r)
                    return dict(gbps=SIZE / r["secs"] / 1e9)

                conts = [("fio-2j", lambda: run_fio(path, 2, None)),
                         ("fio-2j-huge", lambda: run_fio(path, 2, huge)),
                         ("fio-1j", lambda: run_fio(path, 1, None)),
                         ("nvio-best", lambda: nvio("%d:128:2:libaio:0:1" % (8 * MiB))),
                         ("nvio-default", lambda: nvio("default"))]
                per = {n: [] for n, _ in conts}
                for n, fn in conts:  # warm-up: buffers made, handles opened
                    core_bench.drop_caches()
                    fn()
                for r in range(a.rounds):
                    order = conts[r % len(conts):] + conts[:r % len(conts)]
                    for n, fn in order:
                        core_bench.drop_caches()
                        s0 = meminfo("Shmem")
                        x = fn()
                        x["shmem_delta"] = meminfo("Shmem") - s0
                        per[n].append(x)
                    print("round %d: %s" % (r + 1, "  ".join("%s %.2f" % (n, per[n][-1]["gbps"])
                                                            for n, _ in conts)), file=sys.stderr)
        finally:
            if srv is not None:
                try:
                    srv.stdin.write("quit\n")
                    srv.stdin.close()
                except (OSError, AttributeError):
                    pass
                srv.wait()

    med = statistics.median
    out = ["# RAM-disk write ceiling: what fio's 2-job runs do — %s" % datetime.date.today(), "",
           "- date: %s UTC; %d cores, kernel %s" % (
               datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), os.cpu_count(),
               platform.release()),
           "- nvio: %s" % subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h %s"],
                                          capture_output=True, text=True).stdout.strip(),
           "- command: `python3 bench/ram_ceiling.py %s`" % " ".join(sys.argv[1:]),
           "- RAM disk: bench/ramdisk.sh up 4G (ext4 on loop over tmpfs); 1 GiB file written "
           "once, then overwritten in place by every run; %d rounds interleaved and rotated "
           "after one warm-up run each" % a.rounds]
    out += ["- " + n for n in notes]
    out += ["", "| contender | GB/s (span) median | min–max | × nvio-best | fio's own GB/s "
            "(bytes / longest job) | GB/s by process wall time | Shmem change per run |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    nb = per["nvio-best"]
    for n, v in per.items():
        g = [x["gbps"] for x in v]
        out.append("| %s | %.2f | %.2f–%.2f | %.2f | %s | %s | %s |" % (
            n, med(g), min(g), max(g), med([x["gbps"] / y["gbps"] for x, y in zip(v, nb)]),
            "%.2f (max %.2f)" % (med([x["own"] for x in v]), max(x["own"] for x in v))
            if "own" in v[0] else "",
            "%.2f" % med([x["wall"] for x in v]) if "wall" in v[0] else "",
            "%+d MiB" % (max(abs(x["shmem_delta"]) for x in v) >> 20)))
    out += ["", "Per round, GB/s (span):", ""]
    for n, v in per.items():
        out.append("- %s: %s" % (n, " ".join("%.2f" % x["gbps"] for x in v)))
    out += ["", "fio jobs per run (times in ms from the first job's start; offsets in MiB):", ""]
    for n in ("fio-2j", "fio-2j-huge", "fio-1j"):
        for i, x in enumerate(per[n]):
            t0 = min(j["start"] for j in x["jobs"])
            out.append("- %s r%d: %s; own %.2f, span %.2f" % (n, i + 1, "; ".join(
                "job %d %0.f–%.0f ms [%d, %d) MiB" % (k + 1, (j["start"] - t0) * 1e3,
                                                       (j["end"] - t0) * 1e3, j["lo"] >> 20,
                                                       j["hi"] >> 20)
                for k, j in enumerate(x["jobs"])), x["own"], x["gbps"]))
    core_bench.emit(out, a.out)


if __name__ == "__main__":
    main()
