#!/usr/bin/env python3
"""Python-level load and store of one torch tensor: nvio against the alternatives.

Methods (each stores the tensor to its own file, then loads it back):
  nvio        nvio.AioHandle().sync_pwrite / sync_pread
  deepspeed   DeepSpeed's aio_handle, the very same calls (only if
              `import deepspeed` works and its async_io op builds)
  python      open(..., buffering=0).write(memoryview) / readinto()
  torch       torch.save / torch.load

Fairness: every store ends in an fsync of the file (inside the timing); every
load starts from a cold page cache (drop_caches as root; otherwise loads are
marked warm unless --direct makes nvio/DeepSpeed bypass the cache). Rounds
are interleaved (the method order rotates each round) and the table reports
medians: GB/s, the median of per-round time ratios against nvio, and CPU
seconds per GB (process CPU time, all threads).

    python bench/py_load_store.py                 # 1 GiB, 5 rounds, in /tmp
    python bench/py_load_store.py --size 64M --rounds 5 --dir /local_nvme
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import guestmem  # bench/guestmem.py

try:
    import nvio
except ImportError:  # run from a source tree after build_ext --inplace
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import nvio


def parse_size(s):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip().lower().rstrip("ib").rstrip("b")
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_caches():
    """True if the page cache was dropped (needs root)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


class Method:
    name = ""

    def store(self, t, path):
        raise NotImplementedError

    def load(self, t, path):
        raise NotImplementedError


class NvioMethod(Method):
    name = "nvio"

    def __init__(self, a, locked=False):
        self.h = nvio.AioHandle(a.block_size, a.queue_depth, False, a.overlap_events,
                                a.intra_op_parallelism,
                                direct="on" if a.direct else "auto")
        self.locked = locked
        if locked:
            self.name = "nvio-locked"
        self.note = (f"{self.h.get_engine()}, direct={self.h.get_direct()}, "
                     f"{'new_cpu_locked_tensor' if locked else 'pageable torch tensor'}")

    def store(self, t, path):
        self.h.sync_pwrite(t, path)
        fsync_path(path)

    def load(self, t, path):
        self.h.sync_pread(t, path)
        return t


class DeepSpeedMethod(Method):
    name = "deepspeed"

    def __init__(self, a, locked=False):
        from deepspeed.ops.op_builder import AsyncIOBuilder
        self.h = AsyncIOBuilder().load(verbose=False).aio_handle(
            a.block_size, a.queue_depth, False, a.overlap_events, a.intra_op_parallelism)
        import deepspeed
        self.locked = locked
        if locked:
            self.name = "deepspeed-locked"
        self.note = (f"deepspeed {deepspeed.__version__}, libaio, O_DIRECT, "
                     f"{'its new_cpu_locked_tensor' if locked else 'pageable torch tensor'}")

    def store(self, t, path):
        if os.path.exists(path):
            os.unlink(path)          # its pwrite does not truncate
        r = self.h.sync_pwrite(t, path)
        if r < 0:
            raise OSError(f"deepspeed sync_pwrite returned {r}")
        fsync_path(path)

    def load(self, t, path):
        r = self.h.sync_pread(t, path)
        if r < 0:
            raise OSError(f"deepspeed sync_pread returned {r}")
        return t


class PythonMethod(Method):
    name = "python"
    note = "open(buffering=0) write / readinto"

    def store(self, t, path):
        mv = memoryview(t.numpy()).cast("B")
        with open(path, "wb", buffering=0) as f:
            n = 0
            while n < len(mv):
                n += f.write(mv[n:])
            os.fsync(f.fileno())

    def load(self, t, path):
        mv = memoryview(t.numpy()).cast("B")
        with open(path, "rb", buffering=0) as f:
            n = 0
            while n < len(mv):
                got = f.readinto(mv[n:])
                if not got:
                    raise EOFError(path)
                n += got
        return t


class TorchMethod(Method):
    name = "torch"
    note = "torch.save / torch.load"

    def store(self, t, path):
        with open(path, "wb") as f:
            torch.save(t, f)
            f.flush()
            os.fsync(f.fileno())

    def load(self, t, path):
        return torch.load(path, weights_only=True)


class ToolMethod(Method):
    """The C tool moving the same bytes with the same handle settings and a
    locked buffer: the figure the Python binding is held to (>= 0.95x)."""
    name = "nvio C tool"
    locked = True

    def __init__(self, a, n):
        self.tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                 "build", "nvio")
        if not os.access(self.tool, os.X_OK):
            raise FileNotFoundError(f"{self.tool} (run make)")
        self.cmd = [self.tool, "bench", "--dir", a.dir, "--size", str(n), "--loops", "1",
                    "--warmup", "0", "--json", "--no-tuned",
                    "--block-size", str(a.block_size), "--queue-depth", str(a.queue_depth),
                    "--parallelism", str(a.intra_op_parallelism),
                    "--overlap-events" if a.overlap_events else "--no-overlap-events",
                    "--direct", "on" if a.direct else "auto"]
        self.n = n
        self.note = "build/nvio bench, locked buffer, same handle settings"

    def _run(self, op):
        out = subprocess.run(self.cmd + [f"--{op}"], check=True, capture_output=True,
                             text=True).stdout
        r = json.loads(out)[op]
        return self.n / (r["gbps"]["median"] * 1e9), r.get("cpu_s_per_gb", 0.0) * self.n / 1e9

    def store(self, t, path):
        return self._run("write")

    def load(self, t, path):
        return self._run("read")


def make_methods(a, n):
    methods, notes = [NvioMethod(a), NvioMethod(a, locked=True)], []
    if not a.no_deepspeed:
        try:
            methods += [DeepSpeedMethod(a), DeepSpeedMethod(a, locked=True)]
        except Exception as e:  # not installed, or its op does not build here
            notes.append(f"deepspeed skipped: {type(e).__name__}: {str(e)[:200]}")
    try:
        methods.append(ToolMethod(a, n))
    except OSError as e:
        notes.append(f"C tool skipped: {e}")
    methods += [PythonMethod(), TorchMethod()]
    return methods, notes


def measure(fn):
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="1G", help="tensor size, e.g. 1G, 64M (default 1G)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (>= 5 for the record)")
    p.add_argument("--dir", default="/tmp", help="directory for the files")
    p.add_argument("--block_size", type=int, default=1 << 20)
    p.add_argument("--queue_depth", type=int, default=32)
    p.add_argument("--intra_op_parallelism", type=int, default=1)
    p.add_argument("--overlap_events", action="store_true")
    p.add_argument("--direct", action="store_true", help="force O_DIRECT for nvio")
    p.add_argument("--no_deepspeed", action="store_true", help="skip DeepSpeed")
    p.add_argument("--no_verify", action="store_true", help="skip the byte checks")
    p.add_argument("--keep_page_reporting", action="store_true",
                   help="leave the VM's free page reporting on (see bench/guestmem.py)")
    a = p.parse_args()

    n = parse_size(a.size)
    gb = n / 1e9
    methods, notes = make_methods(a, n)
    src = torch.randint(0, 256, (n,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    # Locked buffers, each from its own library, for the "-locked" rows.
    bufs = {}
    for m in methods:
        if getattr(m, "locked", False) and hasattr(m, "h"):
            s = m.h.new_cpu_locked_tensor(n, src)
            s.copy_(src)
            bufs[m.name] = (s, m.h.new_cpu_locked_tensor(n, src))
    paths = {m.name: os.path.join(a.dir, f"py_load_store.{m.name}.{os.getpid()}.bin")
             for m in methods}
    res = {m.name: {"store": [], "load": [], "store_cpu": [], "load_cpu": []} for m in methods}
    with guestmem.page_reporting_paused(not a.keep_page_reporting) as guest:
        cold = run_rounds(a, methods, bufs, paths, res, src, dst)
    report(a, n, methods, res, notes, cold, guest)


def run_rounds(a, methods, bufs, paths, res, src, dst):
    """Returns whether every load started from a cold page cache."""
    cold = True
    try:
        for r in range(a.rounds):
            order = methods[r % len(methods):] + methods[:r % len(methods)]
            for m in order:
                path = paths[m.name]
                s, d = bufs.get(m.name, (src, dst))
                if isinstance(m, ToolMethod):   # it times itself, on its own file
                    for op, key in (("store", "store"), ("load", "load")):
                        drop_caches()
                        secs, cpu = getattr(m, op)(None, None)
                        res[m.name][key].append(secs)
                        res[m.name][key + "_cpu"].append(cpu)
                    continue
                secs, cpu, _ = measure(lambda: m.store(s, path))
                res[m.name]["store"].append(secs)
                res[m.name]["store_cpu"].append(cpu)
                cold = drop_caches() and cold
                d.zero_()
                secs, cpu, out = measure(lambda: m.load(d, path))
                res[m.name]["load"].append(secs)
                res[m.name]["load_cpu"].append(cpu)
                if not a.no_verify and not torch.equal(out, src):
                    raise SystemExit(f"{m.name}: loaded bytes differ from the stored ones")
                del out
                os.unlink(path)
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    finally:
        for path in paths.values():
            if os.path.exists(path):
                os.unlink(path)
    return cold


def report(a, n, methods, res, notes, cold, guest):
    gb = n / 1e9
    base = res["nvio"]
    print(f"\n### Load and store of a {n / (1 << 30):.3f} GiB torch.uint8 CPU tensor, "
          f"{a.rounds} interleaved rounds\n")
    print(f"Directory {a.dir}; stores end in fsync; loads "
          f"{'from a cold page cache (drop_caches)' if cold else 'WARM (not root: no drop_caches)'}; "
          f"handle block_size={a.block_size} queue_depth={a.queue_depth} "
          f"intra_op_parallelism={a.intra_op_parallelism}.\n")
    print("| method | store GB/s | load GB/s | store time ÷ nvio (>1 slower) | load time ÷ nvio (>1 slower) "
          "| store CPU s/GB | load CPU s/GB | notes |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for m in methods:
        d = res[m.name]
        rs = statistics.median(x / y for x, y in zip(d["store"], base["store"]))
        rl = statistics.median(x / y for x, y in zip(d["load"], base["load"]))
        print(f"| {m.name} | {gb / statistics.median(d['store']):.2f} "
              f"| {gb / statistics.median(d['load']):.2f} | {rs:.2f}x | {rl:.2f}x "
              f"| {statistics.median(d['store_cpu']) / gb:.3f} "
              f"| {statistics.median(d['load_cpu']) / gb:.3f} | {getattr(m, 'note', '')} |")
    if "nvio C tool" in res:
        tool = res["nvio C tool"]
        for name in ("nvio-locked", "nvio"):
            d = res[name]
            rs = statistics.median(y / x for x, y in zip(d["store"], tool["store"]))
            rl = statistics.median(y / x for x, y in zip(d["load"], tool["load"]))
            print(f"\n{name} vs the C tool, same transfer (median of per-round ratios, target "
                  f">= 0.95x): store {rs:.2f}x, load {rl:.2f}x")
    for note in notes:
        print(f"\n_{note}_")
    note = guest["note"]
    if "reported_mib" in guest:
        note += f"; reported to the host during the rounds: {guest['reported_mib']} MiB"
    print(f"\n{note} (bench/guestmem.py).")
    print(f"\nnvio {nvio.__version__}, torch {torch.__version__}, Python "
          f"{sys.version.split()[0]}, {os.cpu_count()} CPUs.")


if __name__ == "__main__":
    main()
