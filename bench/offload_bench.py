#!/usr/bin/env python3
"""bench/offload_bench.py - an AdamW step with its state on NVMe (nvio.offload.
NVMeOptimizer) against the same step with the state in memory, and against
the I/O bound: state bytes read / fio-best read GB/s + state bytes written /
fio-best write GB/s, fio measured on the same directory in the same rounds.

Rounds are interleaved (in-memory, NVMe, fio read, fio write) and the report
gives medians of per-round ratios with the raw figures. The NVMe step's time
is split into waiting for reads, compute, and waiting for writes (the
optimizer's ``last_step``).

  python3 bench/offload_bench.py --dir /var/tmp --params 64M --rounds 3
  python3 bench/offload_bench.py --dir /mnt/ram --params 1G     # 16 GB of state

Memory: the model's fp32 parameters and grads (8 bytes per parameter) plus
the pool (3 sub-groups) for NVMe; the in-memory contender also holds the
8 bytes per parameter of AdamW moments (use --no-memory to skip it when that
does not fit).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# nvio comes from the installed package (pip install .)


def parse(s):
    m = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(s[:-1]) * m[s[-1].upper()]) if s[-1].upper() in m else int(s)


def fio(path, rw, size):
    """Best GB/s of a small fio sweep (O_DIRECT, fsync at the end of writes)."""
    best = 0.0
    for bs, qd, eng in (("1M", 32, "libaio"), ("4M", 64, "io_uring")):
        cmd = ["fio", "--name=x", "--filename=" + path, "--rw=" + rw, "--bs=" + bs,
               "--iodepth=%d" % qd, "--ioengine=" + eng, "--direct=1", "--size=%d" % size,
               "--numjobs=1", "--output-format=json"] + (["--end_fsync=1"] if rw == "write" else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            continue
        j = json.loads(r.stdout)["jobs"][0]
        part = j["read" if rw == "read" else "write"]
        best = max(best, part["io_bytes"] / (part["runtime"] / 1e3) / 1e9 if part["runtime"] else 0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--params", default="64M")
    ap.add_argument("--tensor", default="16M", help="elements per parameter tensor")
    ap.add_argument("--sub-group", default="16M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-safe-steps", action="store_true",
                    help="skip the per-sub-group parameter snapshot (restores on a failed write)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import nvio
    from nvio.offload import NVMeOptimizer
    n, per = parse(a.params), parse(a.tensor)
    sizes = [per] * (n // per) + ([n % per] if n % per else [])
    torch.manual_seed(0)
    d = tempfile.mkdtemp(dir=a.dir, prefix="offload-bench-")
    pm = [torch.nn.Parameter(torch.randn(k)) for k in sizes]
    for p in pm:
        p.grad = torch.randn_like(p) * 1e-3
    state_bytes = 8 * n                      # AdamW moments (the step scalars are noise)
    opt = NVMeOptimizer(torch.optim.AdamW(pm, lr=1e-4), d, sub_group_numel=parse(a.sub_group))
    opt.safe_steps = not a.no_safe_steps
    opt.step()                               # the state exists on NVMe from here on
    ref_opt = None
    if not a.no_memory:
        ref_p = [torch.nn.Parameter(p.detach().clone()) for p in pm]
        for p, q in zip(ref_p, pm):
            p.grad = q.grad
        ref_opt = torch.optim.AdamW(ref_p, lr=1e-4)
        ref_opt.step()
    fpath = os.path.join(d, "fio.bin")
    rows = []
    for r in range(a.rounds):
        row = {}
        if ref_opt is not None:
            t = time.perf_counter()
            ref_opt.step()
            row["memory_s"] = time.perf_counter() - t
        t = time.perf_counter()
        opt.step()
        row["nvme_s"] = time.perf_counter() - t
        row.update({k: v for k, v in opt.last_step.items() if k != "total"})
        row["fio_write_GBps"] = fio(fpath, "write", state_bytes)
        row["fio_read_GBps"] = fio(fpath, "read", state_bytes)
        row["io_bound_s"] = state_bytes / 1e9 / row["fio_read_GBps"] + \
            state_bytes / 1e9 / row["fio_write_GBps"]
        row["nvme_GBps"] = 2 * state_bytes / 1e9 / row["nvme_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    opt.close()
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    med = lambda k: statistics.median(x[k] for x in rows)
    ratio = lambda a_, b: statistics.median(x[a_] / x[b] for x in rows)
    lines = ["# Offload: AdamW step with the state on NVMe (%s)" % datetime.date.today(), "",
             "Machine: %s, %d cores, kernel %s; load average %s at the end (above ~0.5: other jobs shared the machine)."
             % (platform.node(), os.cpu_count(), platform.release(),
                open("/proc/loadavg").read().split()[0]),
             "Directory: %s (%s). nvio %s, torch %s." % (
                 a.dir, subprocess.run(["df", "--output=source,fstype", a.dir],
                                       capture_output=True, text=True).stdout.split()[-2:],
                 nvio.__version__, torch.__version__),
             "Command: `python3 bench/offload_bench.py %s`" % " ".join(sys.argv[1:]), "",
             "%d fp32 parameters in tensors of %d; AdamW moments %.2f GB read and written "
             "per step; sub-groups of %d elements; pool %.0f MiB; safe_steps %s." % (
                 n, per, state_bytes / 1e9, parse(a.sub_group), opt.swapper.pool_bytes / 2**20,
                 opt.safe_steps),
             "", "| | median |", "|---|---|"]
    if ref_opt is not None:
        lines.append("| step, state in memory (s) | %.3f |" % med("memory_s"))
    lines += ["| step, state on NVMe (s) | %.3f |" % med("nvme_s"),
              "| of which: waiting for reads / compute / waiting for writes (s) | %.3f / %.3f / %.3f |"
              % (med("read_wait"), med("compute"), med("write_wait")),
              "| I/O bound: bytes / fio-best read + bytes / fio-best write (s) | %.3f |" % med("io_bound_s"),
              "| fio-best read / write GB/s | %.2f / %.2f |" % (med("fio_read_GBps"), med("fio_write_GBps")),
              "| offload traffic GB/s (read + write) | %.2f |" % med("nvme_GBps"),
              "| **NVMe step / I/O bound** (target <= 1.25) | **%.2f** |" % ratio("nvme_s", "io_bound_s")]
    if ref_opt is not None:
        lines.append("| NVMe step / in-memory step | %.1f |" % ratio("nvme_s", "memory_s"))
    lines += ["", "Raw rounds:", "", "```"] + [json.dumps(x) for x in rows] + ["```", ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
