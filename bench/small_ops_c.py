#!/usr/bin/env python3
"""Cost per call of 4 KiB reads from C: nvio_file_pread on a file opened once
against os.preadv from Python, pread(2) and fio (io_uring and psync, QD1), in
interleaved rounds.

Issue 15's target is nvio_file_pread <= 1.1x os.preadv per call; pread(2)
from C is the stricter floor and stays in the table beside it.

Scenarios (each a file and a set of methods; see bench/small_ops_c.c):
  tmpfs-warm   a 256 MiB file in /dev/shm: pread, file, py-preadv,
               fio io_uring and psync buffered (--methods adds fd,
               file-locked)
  disk-warm    a 256 MiB file on the real disk, read once before every
               run so the page cache holds it: the same methods
  disk-cold    a 1 GiB file on the real disk, buffered, caches dropped
               before every run (N random reads of 262,144 slots: some
               land on a page an earlier read brought in)
  disk-direct  a 1 GiB file on the real disk, O_DIRECT for everyone,
               caches dropped before every run: pread-direct,
               file-direct, py-preadv-direct, fio io_uring and psync
               --direct=1

py-preadv is `os.preadv(fd, [memoryview], off)` in a loop in a Python
child process (this script with --py-child; interpreter start-up not
timed): the same offsets, the same 1000 untimed warm-up calls, the same
check of each result as the C methods, into a page-aligned mmap buffer.

Every C method does N calls at the same pseudo-random 4 KiB-aligned
offsets (a new seed each round); fio does N random reads of its own
(--number_ios=N, --norandommap). ns per call = wall time of the N calls / N
(fio: its job runtime / its I/O count; its own mean completion latency,
lat, in a column of its own). Ratios are taken within a round against
pread(2) (or pread-direct) and against py-preadv, and reported as the
median over rounds.

    python3 bench/small_ops_c.py --rounds 5 --n 100000 --out bench/results/x.md
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def uptime():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def build(lib, out):
    libs = sh(["make", "-s", "-C", ROOT, "print-libs"]).split()
    sh(["cc", "-O2", "-I" + os.path.join(ROOT, "include"), os.path.join(HERE, "small_ops_c.c"),
        lib, "-o", out] + libs)


def make_file(path, nbytes):
    if os.path.exists(path) and os.path.getsize(path) == nbytes:
        return
    with open(path, "wb") as f:
        left = nbytes
        while left:
            k = min(left, 64 << 20)
            f.write(os.urandom(k))
            left -= k
        f.flush()
        os.fsync(f.fileno())


def warm(path):
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def run_c(exe, path, method, n, bs, seed):
    r = json.loads(sh([exe, path, method, str(n), str(bs), str(seed)]))
    return r["ns"], r["user_ns"] + r["sys_ns"]


def offsets(n, bs, seed, slots):
    """The offsets small_ops_c.c draws (its LCG, in 64-bit arithmetic)."""
    m = (1 << 64) - 1
    x = (seed * 2654435761 + 12345) & m
    out = []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & m
        out.append(((x >> 17) % slots) * bs)
    return out


def py_child(path, n, bs, seed, direct):
    """os.preadv per call, measured like small_ops_c.c measures its methods."""
    import mmap
    import resource
    import time
    slots = os.path.getsize(path) // bs
    offs = offsets(n + 1000, bs, seed, slots)
    buf = mmap.mmap(-1, bs)  # page-aligned, as O_DIRECT wants
    bufs = [memoryview(buf)]
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    preadv = os.preadv

    def loop(offs):
        for off in offs:
            if preadv(fd, bufs, off) != bs:
                raise SystemExit("py-preadv: short read at %d" % off)

    loop(offs[n:])  # warm-up
    timed = offs[:n]
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter_ns()
    loop(timed)
    t1 = time.perf_counter_ns()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    os.close(fd)
    print(json.dumps({"method": "py-preadv", "n": n, "bs": bs, "ns": (t1 - t0) / n,
                      "user_ns": (r1.ru_utime - r0.ru_utime) * 1e9 / n,
                      "sys_ns": (r1.ru_stime - r0.ru_stime) * 1e9 / n}))


def run_py(path, direct, n, bs, seed):
    r = json.loads(sh([sys.executable, os.path.abspath(__file__), "--py-child", path, str(n),
                       str(bs), str(seed), str(direct)]))
    return r["ns"], r["user_ns"] + r["sys_ns"]


def run_fio(path, engine, direct, n, bs):
    cmd = ["fio", "--name=qd1", "--filename=" + path, "--rw=randread", "--bs=%d" % bs,
           "--iodepth=1", "--ioengine=" + engine, "--direct=%d" % direct,
           "--number_ios=%d" % n, "--size=%d" % os.path.getsize(path), "--norandommap",
           "--randrepeat=0", "--invalidate=0", "--output-format=json"]
    out = sh(cmd)
    j = json.loads(out[out.index("{"):])["jobs"][0]
    rd = j["read"]
    ios = rd["total_ios"]
    cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * j["job_runtime"] * 1e6 / ios
    return rd["runtime"] * 1e6 / ios, cpu, rd["lat_ns"]["mean"], " ".join(cmd)


BUFFERED = ["pread", "file", "py-preadv", "fio-io_uring", "fio-psync"]
SCEN = {
    "tmpfs-warm": dict(methods=BUFFERED, base="pread", direct=0, size=256 << 20),
    "disk-warm": dict(methods=BUFFERED, base="pread", direct=0, size=256 << 20),
    "disk-cold": dict(methods=BUFFERED, base="pread", direct=0, size=1 << 30, cold=1),
    "disk-direct": dict(methods=["pread-direct", "file-direct", "py-preadv-direct",
                                 "fio-io_uring", "fio-psync"],
                        base="pread-direct", direct=1, size=1 << 30),
}


def main():
    if len(sys.argv) == 7 and sys.argv[1] == "--py-child":
        a = sys.argv[2:]
        return py_child(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--bs", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scenarios", default="tmpfs-warm,disk-warm,disk-direct")
    ap.add_argument("--tmpfs-dir", default="/dev/shm")
    ap.add_argument("--disk-dir", default="/root/nvio-bench")
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libnvio.a"))
    ap.add_argument("--also-lib", action="append", default=[], metavar="NAME=LIB",
                    help="also run the file method (file-direct where direct) with the "
                    "benchmark built against LIB, as method file@NAME, in the same rounds "
                    "(e.g. before=/tmp/libnvio-before.a)")
    ap.add_argument("--methods", help="comma list replacing every scenario's methods "
                    "(its base and py-preadv are kept; -direct names where the scenario is)")
    ap.add_argument("--out")
    a = ap.parse_args()

    exe = "/tmp/nvio-small-ops-c-%d" % os.getpid()
    exes = {}
    for spec_ in a.also_lib:
        name, lib = spec_.split("=", 1)
        exes[name] = "%s-%s" % (exe, name)
        build(lib, exes[name])
    load0 = uptime()
    build(a.lib, exe)
    os.makedirs(a.disk_dir, exist_ok=True)
    fio_cmds = {}
    report = []
    made = []
    try:
        for sc in a.scenarios.split(","):
            spec = SCEN[sc]
            d = a.tmpfs_dir if sc.startswith("tmpfs") else a.disk_dir
            path = os.path.join(d, "nvio-small-c-%dM.bin" % (spec["size"] >> 20))
            make_file(path, spec["size"])
            made.append(path)
            names = list(spec["methods"])
            if a.methods:
                sfx = "-direct" if spec["direct"] else ""
                want = [spec["base"], "py-preadv" + sfx]
                for m in a.methods.split(","):
                    m = m if m.startswith("fio-") or m.endswith(sfx) else m + sfx
                    if m not in want:
                        want.append(m)
                names = want
            for name in exes:
                names.append("file%s@%s" % ("-direct" if spec["direct"] else "", name))
            spec = dict(spec, methods=names)
            per = {m: [] for m in names}
            cpu = {m: [] for m in names}
            lat = {m: [] for m in names}
            loads = []
            for r in range(a.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for m in order:
                    if spec["direct"] or spec.get("cold"):
                        drop_caches()
                    elif sc == "disk-warm":
                        warm(path)
                    if m.startswith("fio-"):
                        ns, c, l, cmd = run_fio(path, m[4:], spec["direct"], a.n, a.bs)
                        fio_cmds[(sc, m)] = cmd
                        lat[m].append(l)
                    elif m.startswith("py-preadv"):
                        ns, c = run_py(path, spec["direct"], a.n, a.bs, r + 1)
                    else:
                        m_exe, m_name = exe, m
                        if "@" in m:
                            m_name, lib_name = m.split("@")
                            m_exe = exes[lib_name]
                        ns, c = run_c(m_exe, path, m_name, a.n, a.bs, r + 1)
                    per[m].append(ns)
                    cpu[m].append(c)
                    print("%s round %d %-13s %9.1f ns/call  cpu %9.1f" % (sc, r, m, ns, c),
                          file=sys.stderr)
                loads.append(uptime().split()[0])
            report.append((sc, spec, per, cpu, lat, loads))
    finally:
        for x in [exe] + list(exes.values()):
            if os.path.exists(x):
                os.unlink(x)
        for p in made:
            if p.startswith(a.tmpfs_dir):
                os.unlink(p)

    def fs(d):
        return sh(["stat", "-f", "-c", "%T", d]).strip()

    out = ["# Small reads from C: nvio_file_pread vs os.preadv vs pread(2) vs fio QD1 — %s" % datetime.date.today(), "",
           "- date: %s UTC" % datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
           "- machine: %d cores, %s, kernel %s; %s" % (
               os.cpu_count(), platform.machine(), platform.release(),
               sh(["git", "-C", ROOT, "log", "-1", "--format=nvio %h %s"]).strip()[:80]),
           "- tmpfs dir %s (%s); disk dir %s (%s, virtio disk cached by its host)" % (
               a.tmpfs_dir, fs(a.tmpfs_dir), a.disk_dir, fs(a.disk_dir)),
           "- command: `python3 bench/small_ops_c.py %s`" % " ".join(sys.argv[1:]),
           "- load average before / after: %s / %s" % (load0, uptime()),
           "- %d calls of %d bytes per method per round, %d interleaved rounds (order rotated); "
           "ns = median over rounds of wall ns per call; ratios = median of per-round ratios "
           "to the round's pread(2) and to the round's os.preadv (py-preadv); CPU = user+sys ns "
           "per call (getrusage; fio: its usr+sys share of its runtime), its ratios likewise "
           "(steadier than wall time on a shared machine); fio lat = fio's own mean latency "
           "per I/O" % (a.n, a.bs, a.rounds), ""]
    for sc, spec, per, cpu, lat, loads in report:
        base = per[spec["base"]]
        pyb = per[[m for m in spec["methods"] if m.startswith("py-preadv")][0]]
        cbase = cpu[spec["base"]]
        cpyb = cpu[[m for m in spec["methods"] if m.startswith("py-preadv")][0]]
        out += ["## %s" % sc, "", "1-minute load average after each round: %s" % " ".join(loads), "",
                "| method | ns per call | × %s | × os.preadv | CPU ns per call | CPU × %s "
                "| CPU × os.preadv | fio lat ns | per-round ns |" % (spec["base"], spec["base"]),
                "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for m in spec["methods"]:
            ratio = statistics.median(x / b for x, b in zip(per[m], base))
            rpy = statistics.median(x / b for x, b in zip(per[m], pyb))
            cr = statistics.median(x / b for x, b in zip(cpu[m], cbase))
            cpy = statistics.median(x / b for x, b in zip(cpu[m], cpyb))
            out.append("| %s | %.0f | %.3f | %.3f | %.0f | %.3f | %.3f | %s | %s |" % (
                m, statistics.median(per[m]), ratio, rpy, statistics.median(cpu[m]), cr, cpy,
                "%.0f" % statistics.median(lat[m]) if lat[m] else "",
                " ".join("%.0f" % x for x in per[m])))
        for m in spec["methods"]:
            if lat[m]:
                out.append("")
                out.append("%s: fio's own mean latency %s ns; `%s`" % (
                    m, " ".join("%.0f" % x for x in lat[m]), fio_cmds[(sc, m)]))
        out.append("")
    text = "\n".join(out) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
