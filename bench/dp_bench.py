#!/usr/bin/env python3
"""bench/dp_bench.py - data-parallel nvio.save / nvio.load (2 ranks) against
the single writer and fio-best, in interleaved rotated rounds
(../shared/BENCHMARKING.md).

This process is rank 0; it starts the other ranks (the same script with
--rank) and all meet in a gloo process group on 127.0.0.1. Every rank holds
the same state: bench/vec_sizes.py's Llama-like model (201 tensors, bf16,
2.2 GB) from one seed.

  save-single   rank 0: nvio.save(sd, p)            (the others wait)
  save-dp       every rank: nvio.save(sd, p, group=WORLD)
  save-single-spare, save-dp-spare   the same with spare=True, each into a
                file of its own whose spare the warm-up saves made (so every
                timed save overwrites the blocks of the version before)
  load-single   rank 0: nvio.load(p)
  load-dp       every rank: nvio.load(p, group=WORLD)     (share="auto": on one
                host the same as load-dp-all)
  load-dp-share every rank: nvio.load(p, group=WORLD, share=True): each reads a
                share and broadcasts it
  load-dp-all   every rank: nvio.load(p, group=WORLD, share=False)
  load-dp-cached  as load-dp-all through the page cache (direct=False): the
                ranks read the same pages, the device is read about once
  fio-best      rank 0: the better of libaio 1M x QD32 x 1 job and
                8M x QD128 x N jobs (N = ranks), huge-page buffers, O_DIRECT

Saves are durable; the page cache is dropped before every run. Times are
rank 0's wall time from a barrier before the run to a barrier after it;
CPU s/GB sums every rank's user+system time.

    python3 bench/dp_bench.py --dir /root/nvio-bench --rounds 5 --out bench/results/x.md
    python3 bench/dp_bench.py --disk ram --tensors 120 --rounds 5   # the RAM disk

On the RAM disk the files (checkpoint, two with their spares, fio's) and
both ranks' states share the machine's memory: --tensors keeps them inside
it (24 GiB here: 120 of the 201 tensors).
"""
import argparse
import contextlib
import datetime
import os
import platform
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import core_bench  # noqa: E402
import ramdisk  # noqa: E402
from torch_save import make_sd, log  # noqa: E402

import datetime as _dt  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import nvio  # noqa: E402

MiB = 1 << 20


_buffered = None


def run(name, p, sd, rank):
    """One contender on this rank; None where this rank sits it out."""
    w = dist.group.WORLD
    if name == "save-single":
        return nvio.save(sd, p) if rank == 0 else None
    if name == "save-dp":
        return nvio.save(sd, p, group=w)
    if name == "save-single-spare":
        return nvio.save(sd, p + ".single", spare=True) if rank == 0 else None
    if name == "save-dp-spare":
        return nvio.save(sd, p + ".dp", group=w, spare=True)
    if name == "load-single":
        return nvio.load(p) if rank == 0 else None
    if name == "load-dp":
        return nvio.load(p, group=w)
    if name == "load-dp-share":
        return nvio.load(p, group=w, share=True)
    if name == "load-dp-all":
        return nvio.load(p, group=w, share=False)
    if name == "load-dp-cached":
        global _buffered
        if _buffered is None:
            _buffered = nvio.AioHandle(block_size=8 << 20, queue_depth=32, direct=False,
                                       intra_op_parallelism=2)
        return nvio.load(p, group=w, share=False, handle=_buffered)
    raise ValueError(name)


def timed(name, p, sd, rank):
    dist.barrier()
    if rank == 0:
        core_bench.drop_caches()
    dist.barrier()
    c0, t0 = core_bench.cpu(), time.perf_counter()
    out = run(name, p, sd, rank)
    dist.barrier()
    secs, c = time.perf_counter() - t0, core_bench.cpu() - c0
    cs = [None] * dist.get_world_size()
    dist.all_gather_object(cs, c)
    if out is not None and name.startswith("load"):
        ok = out.keys() == sd.keys() and all(torch.equal(out[k], sd[k]) for k in sd)
        if not ok:
            raise RuntimeError("%s on rank %d loaded wrong data" % (name, rank))
    return secs, sum(cs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--dir", default="/root/nvio-bench")
    ap.add_argument("--out")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--tensors", type=int, default=0, help="only the first N tensors (smoke runs)")
    ap.add_argument("--disk", choices=("real", "ram"), default="real",
                    help="ram: --dir is the RAM disk (bench/ramdisk.py), mounted for the run")
    ap.add_argument("--ram-size", default="12G")
    a = ap.parse_args()
    if a.rank == 0 and a.disk == "ram":
        with ramdisk.mounted(a.ram_size, log) as mnt:
            a.dir = mnt
            sys.argv += ["--dir", mnt]          # the other ranks'
            return bench(a)
    return bench(a)


def bench(a):
    torch.set_num_threads(1)
    if a.rank == 0:
        a.port = core_bench.free_port()
        kids = [subprocess.Popen([sys.executable] + sys.argv + ["--rank", str(r), "--port",
                                                                str(a.port)])
                for r in range(1, a.world)]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.port, rank=a.rank,
                            world_size=a.world, timeout=_dt.timedelta(minutes=30))
    os.makedirs(a.dir, exist_ok=True)
    p = os.path.join(a.dir, "nvio-dp.pt")
    pf = os.path.join(a.dir, "nvio-dp-fio.bin")
    sd = make_sd()
    if a.tensors:
        sd = dict(list(sd.items())[:a.tensors])
    saves = ["save-single", "save-dp", "save-single-spare", "save-dp-spare"]
    loads = ["load-single", "load-dp", "load-dp-share", "load-dp-all", "load-dp-cached"]
    res, t_start, guest = {}, time.time(), {"note": "-"}
    rig = contextlib.ExitStack()
    try:
        if a.rank == 0:
            cfgs = [dict(engine="libaio", block=MiB, qd=32, jobs=1, huge=1),
                    dict(engine="libaio", block=8 * MiB, qd=128, jobs=a.world, huge=1)]
            fio, guest = rig.enter_context(
                core_bench.fio_rig(8 * MiB * 128 * a.world + 64 * MiB, log))
        run("save-single", p, sd, a.rank)
        for n in ("save-single-spare", "save-dp-spare"):   # the second save makes the spare
            for _ in range(2):
                run(n, p, sd, a.rank)
        dist.barrier()
        fsize = os.path.getsize(p)
        fbytes = fsize // (16 * MiB) * (16 * MiB)
        if a.rank == 0:
            core_bench.Bench.prepare_file(fio, pf, fbytes)
        for phase, names, op in (("save", saves, "write"), ("load", loads, "read")):
            allc = names + ["fio-best"]
            per = {n: [] for n in allc}
            for r in range(a.rounds):
                order = allc[r % len(allc):] + allc[:r % len(allc)]
                for n in order:
                    if n == "fio-best":
                        dist.barrier()
                        if a.rank == 0:
                            best = max((fio.run_fio(op, pf, fbytes, c) for c in cfgs),
                                       key=lambda x: x["gbps"])
                            per[n].append(dict(gbps=best["gbps"], cpu=best["cpu"]))
                        dist.barrier()
                        continue
                    secs, c = timed(n, p, sd, a.rank)
                    per[n].append(dict(gbps=fsize / secs / 1e9, cpu=c / (fsize / 1e9)))
                if a.rank == 0:
                    log("%s round %d: %s" % (phase, r + 1, "  ".join(
                        "%s %.2f" % (n, per[n][-1]["gbps"]) for n in allc)))
            res[phase] = per
    finally:
        if a.rank == 0:
            spares = [os.path.join(a.dir, ".nvio-dp.pt.%s.nvio-spare" % s) for s in ("single", "dp")]
            for x in [p, pf, p + ".single", p + ".dp"] + spares:
                try:
                    os.unlink(x)
                except OSError:
                    pass
        rig.close()
    if a.rank != 0:
        return
    for k in kids:
        k.wait(timeout=120)
    out = ["# data-parallel nvio.save / nvio.load, %d ranks — %s" % (a.world, datetime.date.today()),
           "",
           "- date: %s UTC; wall %.0f min" % (datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
                                             (time.time() - t_start) / 60),
           "- machine: %d cores, kernel %s; torch %s; Python %s; nvio %s" % (
               os.cpu_count(), platform.release(), torch.__version__,
               platform.python_version(), nvio.__version__),
           "- nvio commit: %s" % subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h %s"],
                                                 capture_output=True, text=True).stdout.strip(),
           "- dir: %s" % core_bench.disk_info(a.disk, a.dir),
           "- command: `%s`" % " ".join(shlex.quote(x) for x in ["python3"] + sys.argv),
           "- state: bench/vec_sizes.py's model, %d bf16 tensors%s; checkpoint file %d bytes; "
           "every rank holds it; gloo on 127.0.0.1; torch.set_num_threads(1) per rank"
           % (len(sd), " (the first of its 201: --tensors)" if a.tensors else "", fsize),
           "- %s (bench/guestmem.py)" % guest["note"],
           "- %d rounds, interleaved and rotated; page cache dropped before every run; saves "
           "durable; ratios = median of per-round ratios" % a.rounds, ""]
    for phase, base in (("save", "save-single"), ("load", "load-single")):
        out += core_bench.ratio_table("**%s**" % phase, res[phase], base,
                                      cpu="CPU s/GB (all ranks)")
    core_bench.emit(out, a.out)


if __name__ == "__main__":
    main()
