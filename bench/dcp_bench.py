#!/usr/bin/env python3
"""bench/dcp_bench.py - torch.distributed.checkpoint with nvio's storage layer
against DCP's default FileSystemWriter/Reader and fio-best, W ranks, in
interleaved rotated rounds (../shared/BENCHMARKING.md).

This process is rank 0; it starts the other ranks (the same script with
--rank); all meet in a gloo process group on 127.0.0.1. The state is a
Llama-style model from its config (bench/vec_sizes.py's shapes: hidden 2048,
GQA 32/4 heads, intermediate 5632, vocab 32000; --layers of them), fp32,
random weights, every tensor a DTensor sharded by rows over the W ranks
(Shard(0), as FSDP2 holds it): each rank holds 1/W of it.

  dcp-tN      dcp.save(sd, storage_writer=torch's FileSystemWriter(d, thread_count=N))
  nvio        dcp.save(sd, storage_writer=nvio.dcp.FileSystemWriter(d))
  nvio-spare  the same with FileSystemWriter(d, spare=True) into a directory
              kept across its runs (saved into twice, untimed, before the
              rounds): each data file goes into the blocks of the one two
              saves back, which the writer kept as a spare
  fio-best    the better of libaio 1M x QD32 x 1 job and 8M x QD128 x W jobs
              (QD32 for W = 4, to keep fio's huge-page buffers at 1 GiB),
              huge-page buffers, O_DIRECT, end_fsync, on a preallocated file
              of the checkpoint's data size (overwritten in place)
  fio-4k      fio-best's two configurations with fio's own buffers (4 KiB
              pages, as torch's tensors are: a virtio disk takes 254 segments
              per request, so these requests are split; this is the ceiling
              for reading into or writing from the user's own tensors)
  fio-new     8M x QD128 (32) x W jobs writing a file created for the run
              (posix_fallocate first, as nvio's writer does)
  loads: dcp (torch's FileSystemReader on DCP's checkpoint), nvio
  (nvio.dcp.FileSystemReader on nvio's), nvio-x (nvio's reader on DCP's
  checkpoint), fio-best read

Saves are durable (sync_files=True: fsync of every file; nvio also fsyncs
the directory) into a directory removed before each run; the page cache is
dropped before every run. Times are rank 0's wall time between barriers;
CPU s/GB sums every rank's user+system time. Loads are checked (untimed)
against per-tensor checksums.

    python3 bench/dcp_bench.py --world 2 --dir /root/nvio-bench --rounds 5 --out bench/results/x.md
"""
import argparse
import contextlib
import datetime
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import core_bench  # noqa: E402
import vec_sizes  # noqa: E402
from torch_save import log  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402

import nvio  # noqa: E402
import nvio.dcp as nd  # noqa: E402

MiB = 1 << 20
warnings.simplefilter("ignore")


def make_sd(mesh, rank, world, layers):
    tensors, _ = vec_sizes.state_dict(layers=layers)
    g = torch.Generator().manual_seed(1000 + rank)
    sd, sums = {}, {}
    for name, shape in tensors:
        rows = shape[0] // world
        local = torch.randn((rows,) + tuple(shape[1:]), generator=g, dtype=torch.float32)
        sd[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                      shape=torch.Size(shape),
                                      stride=torch.empty(shape, device="meta").stride())
        sums[name] = checksum(local)
    return sd, sums


def checksum(t):
    return int(t.view(torch.int32).sum(dtype=torch.int64))


def data_bytes(d):
    return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--layers", type=int, default=9, help="9: 2.1 GB fp32")
    ap.add_argument("--threads", default="1,4", help="DCP FileSystemWriter thread_counts")
    ap.add_argument("--dir", default="/root/nvio-bench")
    ap.add_argument("--disk", default="real", choices=("real", "ram"),
                    help="what --dir is on (for the report)")
    ap.add_argument("--out")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    W = a.world
    if a.rank == 0:
        a.port = core_bench.free_port()
        kids = [subprocess.Popen([sys.executable] + sys.argv + ["--rank", str(r), "--port",
                                                                str(a.port)])
                for r in range(1, W)]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.port, rank=a.rank,
                            world_size=W, timeout=datetime.timedelta(minutes=30))
    mesh = init_device_mesh("cpu", (W,))
    base = os.path.join(a.dir, "nvio-dcp-bench")
    ck = {"nvio": base + "-nvio", "dcp": base + "-dcp", "run": base + "-run",
          "spare": base + "-spare"}
    pf = base + "-fio.bin"
    sd, sums = make_sd(mesh, a.rank, W, a.layers)
    nbytes = sum(v.to_local().nbytes for v in sd.values())
    tot = [None] * W
    dist.all_gather_object(tot, nbytes)
    state_bytes = sum(tot)
    tcs = [int(x) for x in a.threads.split(",")]

    def writer(name, d):
        if name == "nvio":
            return nd.FileSystemWriter(d)
        if name == "nvio-spare":
            return nd.FileSystemWriter(d, spare=True)
        return dcp.FileSystemWriter(d, thread_count=int(name[len("dcp-t"):]))

    def reader(name, d):
        return nd.FileSystemReader(d) if name.startswith("nvio") else dcp.FileSystemReader(d)

    def timed_save(name, d):
        dist.barrier()
        if a.rank == 0:
            if name != "nvio-spare":      # its directory holds the spares it reuses
                shutil.rmtree(d, ignore_errors=True)
            core_bench.drop_caches()
        dist.barrier()
        c0, t0 = core_bench.cpu(), time.perf_counter()
        dcp.save(sd, storage_writer=writer(name, d))
        dist.barrier()
        return time.perf_counter() - t0, core_bench.cpu() - c0

    def timed_load(name, d):
        for v in sd.values():
            v.to_local().zero_()
        dist.barrier()
        if a.rank == 0:
            core_bench.drop_caches()
        dist.barrier()
        c0, t0 = core_bench.cpu(), time.perf_counter()
        dcp.load(sd, storage_reader=reader(name, d))
        dist.barrier()
        secs, c = time.perf_counter() - t0, core_bench.cpu() - c0
        bad = [k for k, v in sd.items() if checksum(v.to_local()) != sums[k]]
        if bad:
            raise RuntimeError("%s on rank %d loaded wrong data: %s" % (name, a.rank, bad[:3]))
        return secs, c

    def all_cpu(c):
        cs = [None] * W
        dist.all_gather_object(cs, c)
        return sum(cs)

    res, t_start, guest = {}, time.time(), {"note": "-"}
    rig = contextlib.ExitStack()
    sizes = {}
    try:
        if a.rank == 0:
            qd = 128 if W <= 2 else 32         # fio's buffers: <= 2 GiB of huge pages
            cfgs = [dict(engine="libaio", block=MiB, qd=32, jobs=1, huge=1),
                    dict(engine="libaio", block=8 * MiB, qd=qd, jobs=W, huge=1)]
            fio, guest = rig.enter_context(core_bench.fio_rig(8 * MiB * qd * W + 64 * MiB, log))
            guest["huge"] = ("fio-best's buffers in 2 MiB huge pages" if fio.huge_path else
                             "huge pages could not be reserved (other jobs held them): "
                             "fio-best ran with 4 KiB-page buffers, like fio-4k")
        # the checkpoints the loads read
        for name, d in (("nvio", ck["nvio"]), ("dcp-t1", ck["dcp"]),
                        ("nvio-spare", ck["spare"]), ("nvio-spare", ck["spare"])):
            timed_save(name, d)
        if a.rank == 0:
            sizes = {k: data_bytes(ck[k]) for k in ("nvio", "dcp")}
        fbytes = state_bytes // (64 * MiB) * (64 * MiB)   # whole 8 MiB blocks per job
        if a.rank == 0:
            core_bench.Bench.prepare_file(fio, pf, fbytes)
        saves = ["dcp-t%d" % n for n in tcs] + ["nvio", "fio-best", "nvio-spare", "fio-4k",
                                                 "fio-new"]
        loads = ["dcp", "nvio", "nvio-x", "fio-best", "fio-4k"]
        for phase, names, op in (("save", saves, "write"), ("load", loads, "read")):
            per = {n: [] for n in names}
            for r in range(a.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for n in order:
                    if n.startswith("fio"):
                        dist.barrier()
                        if a.rank == 0:
                            if n == "fio-new":
                                os.unlink(pf)
                                c = dict(cfgs[1], huge=1 if fio.huge_path else 0)
                                x = run_fio_new(fio, pf, fbytes, c)
                            else:
                                cs = cfgs if n == "fio-best" and fio.huge_path else \
                                    [dict(c, huge=0) for c in cfgs]
                                x = max((fio.run_fio(op, pf, fbytes, c) for c in cs),
                                        key=lambda x: x["gbps"])
                            per[n].append(dict(gbps=x["gbps"], cpu=x["cpu"]))
                        dist.barrier()
                        continue
                    if phase == "save":
                        secs, c = timed_save(n, ck["spare"] if n == "nvio-spare" else ck["run"])
                    else:
                        d = ck["dcp"] if n in ("dcp", "nvio-x") else ck["nvio"]
                        secs, c = timed_load(n, d)
                    c = all_cpu(c)
                    per[n].append(dict(gbps=state_bytes / secs / 1e9, cpu=c / (state_bytes / 1e9)))
                if a.rank == 0:
                    log("W=%d %s round %d: %s" % (W, phase, r + 1, "  ".join(
                        "%s %.2f" % (n, per[n][-1]["gbps"]) for n in names)))
            res[phase] = per
    finally:
        dist.barrier()
        if a.rank == 0:
            for d in ck.values():
                shutil.rmtree(d, ignore_errors=True)
            try:
                os.unlink(pf)
            except OSError:
                pass
        rig.close()
    if a.rank != 0:
        return
    for k in kids:
        k.wait(timeout=120)
    report(a, res, state_bytes, sizes, guest, t_start, tcs)


def run_fio_new(fio, path, size, cfg):
    """fio writing a file it creates (posix_fallocate, then the writes)."""
    cmd = fio.fio_cmd("write", path, size, cfg)
    cmd = [x for x in cmd if not x.startswith("--fallocate=")] + ["--fallocate=posix"]
    core_bench.drop_caches()
    import json
    import tempfile
    logdir = tempfile.mkdtemp(prefix="nvio-fio-")
    try:
        p = subprocess.run(cmd + ["--write_lat_log=" + os.path.join(logdir, "j"),
                                  "--log_unix_epoch=1"], capture_output=True, text=True,
                           timeout=600)
        if p.returncode:
            raise RuntimeError("fio failed: %s\n%s" % (" ".join(cmd), p.stderr))
        j = json.loads(p.stdout[p.stdout.index("{"):])
        starts = core_bench.fio_job_starts(logdir, len(j["jobs"]))
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    ends, cpu_s, moved = [], 0.0, 0
    for job, st in zip(j["jobs"], starts):
        moved += job["write"]["io_bytes"]
        ends.append(st + job["write"]["runtime"] / 1000.0)
        cpu_s += (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * job["job_runtime"] / 1000.0
    if moved != size:
        raise RuntimeError("fio moved %d bytes, expected %d" % (moved, size))
    # the file's creation and allocation happen before the first write's
    # start: count them, from the process's start, like the others' times
    return core_bench.result(size, max(ends) - min(starts), cpu_s)


def report(a, res, state_bytes, sizes, guest, t_start, tcs):
    med = statistics.median
    W = a.world
    out = ["# DCP save/load: nvio.dcp against torch's FileSystemWriter/Reader, %d rank%s — %s"
           % (W, "s" if W > 1 else "", datetime.date.today()), "",
           "- date: %s UTC; wall %.0f min" % (datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
                                             (time.time() - t_start) / 60),
           "- machine: %d cores (load average %s at the end; above ~0.5: other jobs shared "
           "the machine), kernel %s; torch %s; Python %s; nvio %s" % (
               os.cpu_count(), open("/proc/loadavg").read().split()[0], platform.release(),
               torch.__version__,
               platform.python_version(), nvio.__version__),
           "- nvio commit: %s" % subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h %s"],
                                                 capture_output=True, text=True).stdout.strip(),
           "- dir: %s" % core_bench.disk_info(a.disk, a.dir),
           "- command: `%s`" % " ".join(shlex.quote(x) for x in ["python3"] + sys.argv),
           "- state: Llama-style config (hidden 2048, %d layers, vocab 32000), fp32, random; "
           "%d bytes of tensors, every one a DTensor Shard(0) over %d rank(s) (1/%d each); "
           "gloo on 127.0.0.1; torch.set_num_threads(1) per rank" % (a.layers, state_bytes, W, W),
           "- checkpoint bytes on disk: nvio %s, DCP %s" % (sizes.get("nvio"), sizes.get("dcp")),
           "- %s (bench/guestmem.py); %s" % (guest["note"], guest.get("huge", "-")),
           "- %d rounds, interleaved and rotated; page cache dropped before every run; saves "
           "durable into a directory removed before each run (nvio-spare: kept, it holds the spares); GB/s = tensor bytes / wall time; "
           "ratios = median of per-round ratios; fio rows move the same bytes rounded down to "
           "64 MiB" % a.rounds, ""]
    for phase in ("save", "load"):
        per = res[phase]
        base = "dcp" if phase == "load" else max(
            ("dcp-t%d" % n for n in tcs), key=lambda n: med([x["gbps"] for x in per[n]]))
        out += core_bench.ratio_table("**%s** (DCP's best: %s)" % (phase, base), per, base,
                                      cpu="CPU s/GB (all ranks)")
    core_bench.emit(out, a.out)


if __name__ == "__main__":
    main()
