#!/usr/bin/env python3
"""bench/vec_bench.py - one vectored write and read of ~10,000 pieces drawn
from a transformer state dict (bench/vec_sizes.py, ~2 GiB) with
nvio_file_pwritev / nvio_file_preadv, against one buffer of the same total
(nvio_file_pwrite / nvio_file_pread) and against fio-best on the same
bytes, in interleaved rounds (../shared/BENCHMARKING.md).

Contenders (nvio ones in bench/vec_xfer.c, one nvio handle, CFG):
  vec-aligned    pieces at page-aligned addresses (one arena)
  vec-aligned-thp the same arena made with MADV_HUGEPAGE (2 MiB pages)
  vec-malloc     every piece its own malloc() (unaligned for O_DIRECT)
  single         one locked buffer (nvio_mem_alloc) of the total
  single-malloc  one malloc'd buffer at address + 1
  KIND@0, KIND@1 the same memory with NVIO_STAGE_SMALL_PAGES=0 (or 1) for
                 that run: staged and direct in the same rounds
  fio-best       best of core_bench.py's fio sweep (libaio/io_uring, 1M/8M/128K,
                 1 or 2 jobs, with and without huge-page buffers), chosen by a
                 calibration pass plus a runoff of its top 3

Every run overwrites the same preallocated file from offset 0; writes end
with fsync (NVIO_FSYNC; fio --end_fsync=1); the page cache is dropped
before every run. Reads are checked: each nvio read's checksum must match
the pattern (the file is rewritten by nvio, untimed, before the read
rounds, and each vector write is read back once by `single` first).

    python3 bench/vec_bench.py --rounds 5 --disk real,ram --out bench/results/x.md
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import core_bench  # noqa: E402
import guestmem  # noqa: E402
import hugepages  # noqa: E402
import vec_sizes  # noqa: E402

MiB = 1 << 20


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


class Server:
    def __init__(self, exe):
        self.p = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, bufsize=1)

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        ans = self.p.stdout.readline()
        if not ans:
            raise RuntimeError("vec_xfer died on " + line)
        r = json.loads(ans)
        if not r.get("ok"):
            raise RuntimeError("vec_xfer: %s -> %s" % (line, r))
        return r

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
        except OSError:
            pass
        self.p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--disk", default="real,ram")
    ap.add_argument("--real-dir", default="/root/nvio-bench")
    ap.add_argument("--shards", type=int, default=50)
    ap.add_argument("--cfg", default="default", help="nvio handle config for every nvio "
                    "contender: default or BLOCK:QD:PAR:ENGINE:SINGLE:OVERLAP")
    ap.add_argument("--kinds",
                    default="vec-aligned,vec-aligned-thp,vec-malloc,single,single-malloc")
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "libnvio.a"))
    ap.add_argument("--out")
    a = ap.parse_args()

    sizes = vec_sizes.pieces(shards=a.shards)
    total = sum(sizes)
    sizes_file = "/tmp/nvio-vec-sizes.txt"
    with open(sizes_file, "w") as f:
        f.write("".join("%d\n" % x for x in sizes))
    exe = "/tmp/nvio-vec-xfer"
    libs = subprocess.run(["make", "-s", "-C", REPO, "print-libs"], capture_output=True,
                          text=True, check=True).stdout.split()
    subprocess.run(["cc", "-O2", "-I" + os.path.join(REPO, "include"),
                    os.path.join(HERE, "vec_xfer.c"), a.lib, "-o", exe] + libs, check=True)

    fio = core_bench.Bench.__new__(core_bench.Bench)
    fio.args = argparse.Namespace(quick=False)
    fio.huge_path = None
    kinds = a.kinds.split(",")
    cells = []
    ram_up = False
    srv = Server(exe)
    t0 = time.time()
    import signal
    signal.signal(signal.SIGTERM, lambda *x: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *x: sys.exit(129))
    try:
        ld = srv.ask("load %s %s" % (sizes_file, a.kinds))
        log("loaded %d pieces, %d bytes; %d malloc'd pieces not page-aligned" % (
            ld["pieces"], ld["total"], ld["malloc_not_page_aligned"]))
        with guestmem.page_reporting_paused(True) as guest, \
                hugepages.reserved(8 * MiB * 128 + 64 * MiB, log) as fio.huge_path:
            log(guest["note"])
            for disk in a.disk.split(","):
                if disk == "ram":
                    d = os.environ.get("NVIO_RAMDISK", "/mnt/nvio-ram")
                    # a RAM disk someone else mounted is used and left up:
                    # taking it down would lose their files
                    if not os.path.ismount(d):
                        subprocess.run([os.path.join(HERE, "ramdisk.sh"), "up", "4G"],
                                       check=True)
                        ram_up = True
                    else:
                        log("%s already mounted (not ours): used as it is, left up" % d)
                else:
                    d = a.real_dir
                    os.makedirs(d, exist_ok=True)
                path = os.path.join(d, "nvio-vec.bin")
                fio.prepare_file = core_bench.Bench.prepare_file.__get__(fio)
                fio.log = log
                fio.prepare_file(path, total)
                cell = {"disk": disk, "dir": d, "path": path, "fs": core_bench.disk_info(disk, d)}

                def nvio(op, kind):
                    core_bench.drop_caches()
                    r = srv.ask("run %s %s %s %s" % (op, kind, path, a.cfg))
                    if not r["sum_ok"]:
                        raise RuntimeError("%s %s read wrong bytes" % (op, kind))
                    return dict(gbps=total / r["secs"] / 1e9, cpu=r["cpu"] / (total / 1e9),
                                direct=r["direct"])

                def fio_run(op, c):
                    r = fio.run_fio(op, path, total, c)
                    return dict(gbps=r["gbps"], cpu=r["cpu"])

                # validation: each vector write read back by one buffer
                checks = []
                for k in kinds:
                    if k.startswith("vec-"):
                        nvio("write", k)
                        nvio("read", "single")
                        checks.append("%s write read back by single: ok" % k)
                for op in ("write", "read"):
                    # fio calibration: one pass of the sweep, then its top 3 twice more
                    figs = {}
                    for c in fio.fio_sweep():
                        figs[json.dumps(c, sort_keys=True)] = [fio_run(op, c)["gbps"]]
                    top = sorted(figs, key=lambda k: -statistics.median(figs[k]))[:3]
                    for rep in range(2):
                        for k in top[rep % 3:] + top[:rep % 3]:
                            figs[k].append(fio_run(op, json.loads(k))["gbps"])
                    best = max(figs, key=lambda k: statistics.median(figs[k]))
                    log("%s %s fio-best %s (%s)" % (disk, op, best, figs[best]))
                    if op == "read":
                        nvio("write", "single")  # the pattern back for the checksums
                    conts = [(k, (lambda k=k: nvio(op, k))) for k in kinds]
                    conts.append(("fio-best", lambda: fio_run(op, json.loads(best))))
                    per = {n: [] for n, _ in conts}
                    for r in range(a.rounds):
                        order = conts[r % len(conts):] + conts[:r % len(conts)]
                        for n, fn in order:
                            per[n].append(fn())
                        log("%s %s round %d: %s" % (disk, op, r + 1, "  ".join(
                            "%s %.2f" % (n, per[n][-1]["gbps"]) for n, _ in conts)))
                    cell[op] = dict(per=per, best=json.loads(best), calib=figs)
                cell["checks"] = checks
                cells.append(cell)
                os.unlink(path)
                if disk == "ram" and ram_up:
                    subprocess.run([os.path.join(HERE, "ramdisk.sh"), "down"])
                    ram_up = False
    finally:
        srv.close()
        if ram_up:
            subprocess.run([os.path.join(HERE, "ramdisk.sh"), "down"])

    def med(x):
        return statistics.median(x)

    out = ["# Vectored I/O of a state dict's pieces: nvio_file_pwritev/preadv vs one buffer "
           "vs fio-best — %s" % datetime.date.today(), "",
           "- date: %s UTC; wall %.0f min" % (datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
                                             (time.time() - t0) / 60),
           "- machine: %d cores, %s, kernel %s, %d GiB RAM" % (
               os.cpu_count(), platform.machine(), platform.release(),
               os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 30),
           "- nvio: %s" % subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h %s"],
                                          capture_output=True, text=True).stdout.strip(),
           "- fio: %s" % subprocess.run(["fio", "--version"], capture_output=True,
                                        text=True).stdout.strip(),
           "- command: `%s`" % " ".join(shlex.quote(x) for x in ["python3"] + sys.argv),
           "- pieces: `bench/vec_sizes.py --shards %d`: %d pieces, %d bytes (%.2f GiB), "
           "%d of them < 4 KiB, laid end to end from offset 0" % (
               a.shards, len(sizes), total, total / 2**30, sum(x < 4096 for x in sizes)),
           "- %s (bench/guestmem.py)" % guest["note"],
           "- nvio handle: `%s` for every nvio contender; vec-malloc: %d of %d pieces not "
           "page-aligned" % (a.cfg, ld["malloc_not_page_aligned"], len(sizes)),
           "- %d rounds, contenders interleaved and rotated; page cache dropped before every "
           "run; writes end with fsync; GB = 10^9 bytes; ratios = median of per-round ratios" %
           a.rounds, ""]
    for cell in cells:
        out += ["## %s disk (%s)" % (cell["disk"], cell["dir"]), "", cell["fs"], ""]
        out += ["- " + c for c in cell["checks"]]
        for op in ("write", "read"):
            per = cell[op]["per"]
            fb = per["fio-best"]
            sg = per.get("single")
            out += ["", "**%s** — fio-best: %s" % (op, core_bench.cfg_str("fio", cell[op]["best"])),
                    "", "| contender | GB/s median | min–max | CPU s/GB | × fio-best | × single |"
                    " per-round GB/s |", "|---|---:|---:|---:|---:|---:|---|"]
            for n, v in per.items():
                g = [x["gbps"] for x in v]
                out.append("| %s | %.2f | %.2f–%.2f | %.3f | %.2f | %s | %s |" % (
                    n, med(g), min(g), max(g), med([x["cpu"] for x in v]),
                    med([x["gbps"] / y["gbps"] for x, y in zip(v, fb)]),
                    "%.2f" % med([x["gbps"] / y["gbps"] for x, y in zip(v, sg)]) if sg else "n/a",
                    " ".join("%.2f" % x for x in g)))
            out += ["", "fio calibration (GB/s): " + "; ".join(
                "%s: %s" % (core_bench.cfg_str("fio", json.loads(k)),
                            " ".join("%.2f" % x for x in v))
                for k, v in sorted(cell[op]["calib"].items(), key=lambda kv: -med(kv[1])))]
        out.append("")
    core_bench.emit(out, a.out)


if __name__ == "__main__":
    main()
