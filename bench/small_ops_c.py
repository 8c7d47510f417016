#!/usr/bin/env python3
"""Cost per call of 4 KiB reads from C: nvio_file_pread on a file opened once
against pread(2) and fio (io_uring and psync, QD1), in interleaved rounds.

Scenarios (each a file and a set of methods; see bench/small_ops_c.c):
  tmpfs-warm   a 256 MiB file in /dev/shm: pread, file, fd, file-locked,
               fio io_uring and psync buffered
  disk-warm    a 256 MiB file on the real disk, read once before every
               round so the page cache holds it: the same methods
  disk-direct  a 1 GiB file on the real disk, O_DIRECT for everyone,
               caches dropped before every run: pread-direct,
               file-direct, fio io_uring and psync --direct=1

Every C method does N calls at the same pseudo-random 4 KiB-aligned
offsets (a new seed each round); fio does N random reads of its own
(--number_ios=N, --norandommap). ns per call = wall time of the N calls / N
(fio: its job runtime / its I/O count, plus its mean latency for
reference). Ratios are taken within a round against pread(2) (or
pread-direct) and reported as the median over rounds.

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


SCEN = {
    "tmpfs-warm": dict(methods=["pread", "file", "fd", "file-locked", "fio-io_uring", "fio-psync"],
                       base="pread", direct=0, size=256 << 20),
    "disk-warm": dict(methods=["pread", "file", "fd", "file-locked", "fio-io_uring", "fio-psync"],
                      base="pread", direct=0, size=256 << 20),
    "disk-direct": dict(methods=["pread-direct", "file-direct", "fio-io_uring", "fio-psync"],
                        base="pread-direct", direct=1, size=1 << 30),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--bs", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scenarios", default="tmpfs-warm,disk-warm,disk-direct")
    ap.add_argument("--tmpfs-dir", default="/dev/shm")
    ap.add_argument("--disk-dir", default="/root/nvio-bench")
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libnvio.a"))
    ap.add_argument("--out")
    a = ap.parse_args()

    exe = "/tmp/nvio-small-ops-c"
    build(a.lib, exe)
    os.makedirs(a.disk_dir, exist_ok=True)
    fio_cmds = {}
    report = []
    made = []
    try:
        for sc in a.scenarios.split(","):
            spec = SCEN[sc]
            d = a.tmpfs_dir if sc.startswith("tmpfs") else a.disk_dir
            path = os.path.join(d, "nvio-small-c-%s.bin" % sc)
            make_file(path, spec["size"])
            made.append(path)
            names = spec["methods"]
            per = {m: [] for m in names}
            cpu = {m: [] for m in names}
            lat = {m: [] for m in names}
            for r in range(a.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for m in order:
                    if spec["direct"]:
                        drop_caches()
                    elif sc == "disk-warm":
                        warm(path)
                    if m.startswith("fio-"):
                        ns, c, l, cmd = run_fio(path, m[4:], spec["direct"], a.n, a.bs)
                        fio_cmds[(sc, m)] = cmd
                        lat[m].append(l)
                    else:
                        ns, c = run_c(exe, path, m, a.n, a.bs, r + 1)
                    per[m].append(ns)
                    cpu[m].append(c)
                    print("%s round %d %-13s %9.1f ns/call  cpu %9.1f" % (sc, r, m, ns, c),
                          file=sys.stderr)
            report.append((sc, spec, per, cpu, lat))
    finally:
        for p in made:
            if p.startswith(a.tmpfs_dir):
                os.unlink(p)

    def fs(d):
        return sh(["stat", "-f", "-c", "%T", d]).strip()

    out = ["# Small reads from C: nvio_file_pread vs pread(2) vs fio QD1 — %s" % datetime.date.today(), "",
           "- date: %s UTC" % datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
           "- machine: %d cores, %s, kernel %s; %s" % (
               os.cpu_count(), platform.machine(), platform.release(),
               sh(["git", "-C", ROOT, "log", "-1", "--format=nvio %h %s"]).strip()[:80]),
           "- tmpfs dir %s (%s); disk dir %s (%s, virtio disk cached by its host)" % (
               a.tmpfs_dir, fs(a.tmpfs_dir), a.disk_dir, fs(a.disk_dir)),
           "- command: `python3 bench/small_ops_c.py %s`" % " ".join(sys.argv[1:]),
           "- %d calls of %d bytes per method per round, %d interleaved rounds (order rotated); "
           "ns = median over rounds of wall ns per call; ratio = median of per-round ratios "
           "to the round's pread(2); CPU = user+sys ns per call" % (a.n, a.bs, a.rounds), ""]
    for sc, spec, per, cpu, lat in report:
        base = per[spec["base"]]
        out += ["## %s" % sc, "",
                "| method | ns per call | × %s | CPU ns per call | per-round ns |" % spec["base"],
                "|---|---:|---:|---:|---|"]
        for m in spec["methods"]:
            ratio = statistics.median(x / b for x, b in zip(per[m], base))
            out.append("| %s | %.0f | %.3f | %.0f | %s |" % (
                m, statistics.median(per[m]), ratio, statistics.median(cpu[m]),
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
