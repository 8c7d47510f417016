#!/usr/bin/env python3
"""bench/core_bench.py - nvio's core benchmark (see bench/README.md and
../shared/BENCHMARKING.md).

Measures whole-file reads and writes of --sizes bytes, on the real disk and
on a RAM-backed disk (bench/ramdisk.sh), in interleaved rounds of:

  nvio-default    nvio_config_init() defaults, locked buffer
  nvio-best       best config of a first-pass sweep, locked buffer
  nvio-pageable   nvio-best's config, malloc'd buffer at address + 1, kept
                  across rounds like the locked one
  fio-best        best of a small fio sweep (block, depth, jobs, engine)
  ds-best         best of a small DeepSpeed aio_handle sweep, its own
                  locked tensor (new_cpu_locked_tensor)
  nvio-py         nvio-best's config from Python: the package's AioHandle
                  with its locked tensor, sync_pwrite/sync_pread on an fd
                  (+ os.fsync), in the worker process (--no-python-nvio
                  leaves it out)
  python          plain buffered open().write()+os.fsync / readinto()

Every contender overwrites the same preallocated file (no truncation) and
every write ends with fsync; before every run, read or write, the page
cache is dropped (sync; echo 3 > /proc/sys/vm/drop_caches). nvio, fio and
DeepSpeed read and write with O_DIRECT; python goes through the page cache.

Each contender times its own transfer (nvio: the nvio_pread/nvio_pwrite
call in bench/nvio_xfer.c; fio: from its first job's first I/O to its last
job's end, end_fsync included (see run_fio);
DeepSpeed and python: the call plus fsync, in a worker process); buffers
and handles are made before, untimed. CPU seconds are that process's user
+ system time over the transfer (getrusage RUSAGE_SELF; fio's usr_cpu and
sys_cpu), per GB (10^9 bytes) moved.

Needs root. Usage:
  python3 bench/core_bench.py                 # full run, ~30 min
  python3 bench/core_bench.py --quick         # ~2 min smoke version
  python3 bench/core_bench.py --sizes 1G --rounds 5 --disk ram
"""

import argparse
import contextlib
import datetime
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import guestmem  # bench/guestmem.py
import hugepages  # bench/hugepages.py
import ramdisk  # bench/ramdisk.py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PAT_K = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1
MiB = 1 << 20
GiB = 1 << 30


def fio_job_starts(logdir, njobs):
    """Start time (s since the epoch) of each fio job, from the latency logs
    written with --write_lat_log=DIR/j --log_unix_epoch=1: the earliest
    completion time (ms) minus that I/O's latency (ns)."""
    starts = []
    for k in range(1, njobs + 1):
        first = None
        with open(os.path.join(logdir, "j_lat.%d.log" % k)) as f:
            for line in f:
                cols = line.split(",")
                t = int(cols[0]) / 1e3 - int(cols[1]) / 1e9
                first = t if first is None else min(first, t)
        if first is None:
            raise RuntimeError("fio job %d logged no I/O" % k)
        starts.append(first)
    return starts


# ----------------------------------------------------------------------------
# Patterns: word i of a file written with seed s is (i * K) ^ s; a reader
# checks the sum of the words at every 4 KiB plus the last word.

def expected_sum(size, seed):
    import numpy as np
    idx = np.arange(0, size // 8, 512, dtype=np.uint64)
    with np.errstate(over="ignore"):
        words = (idx * np.uint64(PAT_K)) ^ np.uint64(seed)
        s = int(words.sum(dtype=np.uint64))
    last = size // 8 - 1
    s += ((last * PAT_K) & M64) ^ seed
    return s & M64


def buffer_sum(arr_u8, size):
    import numpy as np
    w = arr_u8[: size // 8 * 8].view(np.uint64)
    s = int(w[::512].sum(dtype=np.uint64)) + int(w[-1])
    return s & M64


def pattern_fill(arr_u8, size, seed):
    import numpy as np
    w = arr_u8[: size // 8 * 8].view(np.uint64)
    chunk = 8 << 20
    with np.errstate(over="ignore"):
        for start in range(0, w.size, chunk):
            n = min(chunk, w.size - start)
            idx = np.arange(start, start + n, dtype=np.uint64)
            idx *= np.uint64(PAT_K)
            idx ^= np.uint64(seed)
            w[start:start + n] = idx


# ----------------------------------------------------------------------------
# Worker process: DeepSpeed aio_handle and the plain Python baseline.

def worker_main():
    import numpy as np
    ds = None
    ds_err = None
    try:
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):
            from deepspeed.ops.op_builder import AsyncIOBuilder
            ds = AsyncIOBuilder().load(verbose=False)
            import deepspeed
            ds_version = deepspeed.__version__
    except Exception as e:  # noqa: BLE001 - reported to the parent
        ds_err = "%s: %s" % (type(e).__name__, e)
        ds_version = None
    handles = {}  # cfg key -> [handle, tensor, tensor_seed]

    def reply(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def ru():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime, r.ru_stime

    for line in sys.stdin:
        c = json.loads(line)
        cmd = c["cmd"]
        if cmd == "quit":
            break
        if cmd == "info":
            reply({"ok": True, "ds": ds is not None, "ds_err": ds_err,
                   "ds_version": ds_version})
            continue
        if cmd == "free":
            for h, t, _ in handles.values():
                h.free_cpu_locked_tensor(t)
            handles.clear()
            reply({"ok": True})
            continue
        op, path, size, seed = c["op"], c["path"], c["size"], c["seed"]
        if cmd in ("ds", "nvio"):
            # DeepSpeed's aio_handle, or nvio's AioHandle from Python with
            # the C sweep's best config: the same calls on each one's own
            # locked tensor. nvio writes through an fd opened without
            # truncation (by path, nvio's whole-file write is an atomic new
            # file: not this benchmark's overwrite).
            if cmd == "ds" and ds is None:
                reply({"ok": False, "msg": ds_err})
                continue
            cfg = c["cfg"]
            key = cmd + ":" + json.dumps(cfg, sort_keys=True)
            ent = handles.get(key)
            if ent is not None and ent[1].numel() != size:
                ent[0].free_cpu_locked_tensor(ent[1])
                del handles[key]
                ent = None
            if ent is None:
                if c.get("only"):  # calibration: one handle at a time
                    for h, t, _ in handles.values():
                        h.free_cpu_locked_tensor(t)
                    handles.clear()
                import torch
                if cmd == "ds":
                    h = ds.aio_handle(cfg["block"], cfg["qd"], bool(cfg["single"]),
                                      bool(cfg["overlap"]), cfg["par"])
                elif cfg == "default":
                    import nvio
                    h = nvio.AioHandle()
                else:
                    import nvio
                    bs, qd, par, eng, single, overlap = cfg.split(":")
                    h = nvio.AioHandle(block_size=int(bs), queue_depth=int(qd),
                                       single_submit=single == "1",
                                       overlap_events=overlap == "1",
                                       intra_op_parallelism=int(par), engine=eng)
                t = h.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
                ent = handles[key] = [h, t, None]
            h, t, tseed = ent
            a = t.numpy()
            if op == "write":
                if seed != tseed:
                    if seed:
                        pattern_fill(a, size, seed)
                    else:
                        a.fill(0x5A)
                    ent[2] = seed
            else:
                a[: 1 << 20] = 0
                ent[2] = None
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            target = path if cmd == "ds" else fd
            try:
                u0, s0 = ru()
                t0 = time.perf_counter()
                if op == "write":
                    r = h.sync_pwrite(t, target)
                    os.fsync(fd)
                else:
                    r = h.sync_pread(t, target)
                t1 = time.perf_counter()
                u1, s1 = ru()
            finally:
                os.close(fd)
            out = {"ok": r >= 0, "ret": r, "secs": t1 - t0, "user": u1 - u0,
                   "sys": s1 - s0}
            if op == "read":
                out["sum"] = buffer_sum(a, size)
            reply(out)
            continue
        if cmd == "py":
            # One large buffer in this process at a time: DeepSpeed's
            # tensors are made again (untimed) on its next run. Keeps the
            # 4 GiB cells inside this VM's memory beside nvio's two kept
            # buffers and the RAM disk.
            for h, t, _ in handles.values():
                h.free_cpu_locked_tensor(t)
            handles.clear()
            buf = bytearray(size)
            a = np.frombuffer(buf, dtype=np.uint8)
            if op == "write":
                if seed:
                    pattern_fill(a, size, seed)
                else:
                    a.fill(0x5A)
            else:
                a.fill(0)  # fault the pages in, untimed
            u0, s0 = ru()
            t0 = time.perf_counter()
            if op == "write":
                with open(path, "r+b") as f:
                    n = f.write(buf)
                    f.flush()
                    os.fsync(f.fileno())
            else:
                with open(path, "rb") as f:
                    n = f.readinto(buf)
            t1 = time.perf_counter()
            u1, s1 = ru()
            out = {"ok": n == size, "ret": n, "secs": t1 - t0, "user": u1 - u0,
                   "sys": s1 - s0}
            if op == "read":
                out["sum"] = buffer_sum(a, size)
            del a
            del buf
            reply(out)
            continue
        reply({"ok": False, "msg": "unknown command %r" % cmd})


class LineWorker:
    """A child that answers one JSON line per command line."""

    def __init__(self, argv, env=None):
        self.argv = argv
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=env, bufsize=1)

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        ans = self.p.stdout.readline()
        if not ans:
            raise RuntimeError("%s died (exit %s) on: %s" %
                               (self.argv[0], self.p.wait(), line))
        return json.loads(ans)

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.write("quit\n" if "nvio_xfer" in self.argv[0]
                                   else '{"cmd": "quit"}\n')
                self.p.stdin.flush()
                self.p.wait(timeout=60)
            except Exception:  # noqa: BLE001
                self.p.kill()
                self.p.wait()


# ----------------------------------------------------------------------------
# Contenders. Each run returns {"gbps", "cpu" (s per GB), "secs", ...}.

def drop_caches():
    """Before a timed run: the files that earlier saves of this process
    replaced are freed (nvio frees them in the background after a commit,
    which would otherwise land on the next run's time), everything is
    written back, and the page cache is dropped."""
    atomic = sys.modules.get("nvio._atomic")
    if atomic is not None:
        atomic.settle_released()
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def steal_s():
    """Seconds of CPU time the hypervisor took from this VM (all vCPUs)."""
    with open("/proc/stat") as f:
        return int(f.readline().split()[8]) / os.sysconf("SC_CLK_TCK")


def result(size, secs, cpu, **extra):
    d = {"gbps": size / secs / 1e9, "secs": secs, "cpu": cpu / (size / 1e9)}
    d.update(extra)
    return d


class Bench:
    def __init__(self, args):
        self.args = args
        self.huge_path = None  # set by run_all (bench/hugepages.py)
        self.huge_note = "fio sweep without huge-page buffers"
        self.nvio = None
        self.py = None
        self.ds_ok = False
        self.ds_why = None
        self.ds_version = None
        self.notes = []
        self.bugs = []
        self.log_lines = []

    def log(self, msg):
        line = "[%s] %s" % (time.strftime("%H:%M:%S"), msg)
        print(line, file=sys.stderr, flush=True)
        self.log_lines.append(line)

    # -- setup ---------------------------------------------------------------
    def build(self):
        a = self.args
        bdir = a.build_dir
        if a.lib:
            lib = a.lib
        else:
            self.log("building libnvio into %s" % bdir)
            subprocess.run(["make", "-s", "-C", REPO, "BUILD=" + bdir, "lib"], check=True)
            lib = os.path.join(bdir, "libnvio.a")
        libs = subprocess.run(["make", "-s", "-C", REPO, "print-libs"], check=True,
                              capture_output=True, text=True).stdout.split()
        os.makedirs(bdir, exist_ok=True)
        exe = os.path.join(bdir, "nvio_xfer")
        cmd = ["cc", "-O2", "-Wall", "-Wextra", "-I", os.path.join(REPO, "include"),
               "-o", exe, os.path.join(HERE, "nvio_xfer.c"), lib] + libs
        subprocess.run(cmd, check=True)
        self.xfer = exe
        self.lib = lib

    def start_workers(self):
        env = dict(os.environ)
        for k in ("NVIO_ENGINE", "NVIO_DIRECT"):
            env.pop(k, None)
        env["NVIO_NO_TUNED"] = "1"
        self.nvio = LineWorker([self.xfer], env=env)
        if self.args.no_deepspeed:
            self.ds_why = "disabled with --no-deepspeed"
        self.py = LineWorker([sys.executable, os.path.abspath(__file__), "--worker"])
        info = self.py.ask('{"cmd": "info"}')
        if not self.args.no_deepspeed:
            self.ds_ok = info["ds"]
            self.ds_why = info["ds_err"]
            self.ds_version = info["ds_version"]
        self.log("DeepSpeed aio_handle: %s" % ("yes " + str(self.ds_version) if self.ds_ok
                                                else "NO: %s" % self.ds_why))

    def stop_workers(self):
        for w in (self.nvio, self.py):
            if w:
                w.close()

    # -- one run of each kind --------------------------------------------------
    def run_nvio(self, op, path, size, cfgkey, mem="locked", seed=0):
        drop_caches()
        r = self.nvio.ask("run %s %s %s %d %d %s" % (op, mem, path, size, seed, cfgkey))
        if not r["ok"]:
            raise RuntimeError("nvio %s %s %s failed: %s" % (op, mem, cfgkey, r))
        return result(size, r["secs"], r["user"] + r["sys"], sum=r["sum"],
                      engine=r["engine"], mem_flags=r["mem_flags"],
                      resolved="%d:%d:%d:%s:%d:%d" % (r["block"], r["qd"], r["par"],
                                                      r["engine"], r["single"],
                                                      r["overlap"]))

    def run_ds(self, op, path, size, cfg, seed=0, only=False):
        drop_caches()
        r = self.py.ask(json.dumps({"cmd": "ds", "op": op, "path": path, "size": size,
                                    "seed": seed, "cfg": cfg, "only": only}))
        if not r["ok"]:
            raise RuntimeError("DeepSpeed %s %s failed: %s" % (op, cfg, r))
        return result(size, r["secs"], r["user"] + r["sys"], sum=r.get("sum"))

    def run_nvio_py(self, op, path, size, cfgkey, seed=0):
        drop_caches()
        r = self.py.ask(json.dumps({"cmd": "nvio", "op": op, "path": path, "size": size,
                                    "seed": seed, "cfg": cfgkey}))
        if not r["ok"]:
            raise RuntimeError("nvio from Python %s %s failed: %s" % (op, cfgkey, r))
        return result(size, r["secs"], r["user"] + r["sys"], sum=r.get("sum"))

    def run_py(self, op, path, size, seed=0):
        drop_caches()
        r = self.py.ask(json.dumps({"cmd": "py", "op": op, "path": path, "size": size,
                                    "seed": seed}))
        if not r["ok"]:
            raise RuntimeError("python %s failed: %s" % (op, r))
        return result(size, r["secs"], r["user"] + r["sys"], sum=r.get("sum"))

    def fio_cmd(self, op, path, size, cfg):
        jobs = cfg["jobs"]
        per = size // jobs
        cmd = ["fio", "--name=core", "--filename=" + path, "--rw=" + op,
               "--bs=%d" % cfg["block"], "--iodepth=%d" % cfg["qd"],
               "--ioengine=" + cfg["engine"], "--direct=1", "--numjobs=%d" % jobs,
               "--size=%d" % per, "--offset_increment=%d" % per,
               "--fallocate=none", "--invalidate=1", "--output-format=json"]
        if op == "write":
            cmd.append("--end_fsync=1")
        if cfg.get("huge"):
            cmd.append("--mem=mmaphuge:" + self.huge_path)
        return cmd

    def run_fio(self, op, path, size, cfg):
        """fio's time is the span from its first job's start to its last
        job's end. Its own figures (each job's runtime, and group_reporting's
        bandwidth over the longest one) assume the jobs run side by side, but
        each job starts once its own set-up (iodepth x bs of buffers) is
        done: a 2-job 8 MiB x 128 write here ran its jobs 0-131 ms and
        407-623 ms, which the longest runtime counts as 216 ms. The start
        of each job comes from its latency log (the earliest completion
        time minus that I/O's latency); its end is start + runtime, which
        includes end_fsync."""
        drop_caches()
        logdir = tempfile.mkdtemp(prefix="nvio-fio-")
        cmd = self.fio_cmd(op, path, size, cfg) + [
            "--write_lat_log=" + os.path.join(logdir, "j"), "--log_unix_epoch=1"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise RuntimeError("fio failed: %s\n%s" % (" ".join(cmd), p.stderr))
            out = p.stdout
            j = json.loads(out[out.index("{"):])
            starts = fio_job_starts(logdir, len(j["jobs"]))
        finally:
            shutil.rmtree(logdir, ignore_errors=True)
        nbytes = 0
        cpu = 0.0
        ends = []
        for job, start in zip(j["jobs"], starts):
            if job.get("error"):
                raise RuntimeError("fio job error %s" % job["error"])
            d = job[op]
            nbytes += d["io_bytes"]
            ends.append(start + d["runtime"] / 1000.0)
            cpu += (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * job["job_runtime"] / 1000.0
        if nbytes != size:
            raise RuntimeError("fio moved %d bytes, expected %d" % (nbytes, size))
        return result(size, max(ends) - min(starts), cpu)

    # -- sweeps --------------------------------------------------------------
    def nvio_sweep(self):
        if self.args.quick:
            return ["default", "%d:32:1:auto:0:1" % (8 * MiB)]
        s = ["default"]
        for bs in (MiB, 8 * MiB):
            for qd in (32, 128):
                for par in (1, 2):
                    s.append("%d:%d:%d:auto:0:1" % (bs, qd, par))
        return s

    def nvio_stage2(self, best):
        if best == "default":
            best = "%d:128:1:auto:0:0" % MiB
        bs, qd, par, eng, single, overlap = best.split(":")
        out = []
        for e in ("libaio", "psync"):
            out.append(":".join([bs, qd, par, e, single, overlap]))
        out.append(":".join([bs, qd, par, eng, single, "0" if overlap == "1" else "1"]))
        return out if not self.args.quick else []

    def fio_sweep(self):
        s = [dict(engine="libaio", block=MiB, qd=32, jobs=1),
             dict(engine="libaio", block=MiB, qd=32, jobs=2),
             dict(engine="libaio", block=8 * MiB, qd=128, jobs=2),
             dict(engine="libaio", block=128 << 10, qd=64, jobs=1),
             dict(engine="io_uring", block=MiB, qd=32, jobs=1),
             dict(engine="io_uring", block=8 * MiB, qd=128, jobs=2)]
        s = [s[0], s[2]] if self.args.quick else s
        # each also with its buffers in huge pages (BENCHMARKING.md rule 3)
        if self.huge_path:
            s += [dict(c, huge=1) for c in s]
        return s

    def ds_sweep(self):
        s = []
        for bs in (MiB, 8 * MiB):
            for qd in (32, 128):
                for par in (1, 2):
                    s.append(dict(block=bs, qd=qd, par=par, single=0, overlap=1))
        if self.args.quick:
            s = [s[1], s[6]]
        return s

    def calibrate(self, op, path, size):
        """First pass: each contender's sweep, interleaved, best median."""
        reps = self.args.calib_reps
        cands = [("nvio", c) for c in self.nvio_sweep()]
        cands += [("fio", c) for c in self.fio_sweep()]
        if self.ds_ok:
            cands += [("ds", c) for c in self.ds_sweep()]
        figs = {}

        def one(kind, c):
            if kind == "nvio":
                return self.run_nvio(op, path, size, c)
            if kind == "fio":
                return self.run_fio(op, path, size, c)
            return self.run_ds(op, path, size, c, only=True)

        for rep in range(reps):
            for kind, c in cands:
                figs.setdefault((kind, json.dumps(c, sort_keys=True)), []).append(
                    one(kind, c)["gbps"])
        best = {}
        for kind in ("nvio", "fio", "ds"):
            ks = [(statistics.median(v), k) for (kk, k), v in figs.items() if kk == kind]
            if ks:
                best[kind] = json.loads(max(ks)[1])
        # Stage 2 for nvio: the winner's engine and overlap variants.
        extra = self.nvio_stage2(best["nvio"])
        for rep in range(reps):
            for c in extra:
                figs.setdefault(("nvio", json.dumps(c)), []).append(
                    self.run_nvio(op, path, size, c)["gbps"])
        # Runoff: one pass picks a config by luck on a noisy machine (a
        # "best" that then lost to the default in the rounds), so the top
        # few of each contender run more passes, interleaved and rotated,
        # and the best median of all passes wins.
        finalists = []
        for kind in ("nvio", "fio", "ds"):
            ks = sorted(((statistics.median(v), k) for (kk, k), v in figs.items()
                         if kk == kind), reverse=True)
            finalists += [(kind, k) for _, k in ks[:self.args.runoff]]
        for rep in range(self.args.runoff_passes):
            r = rep % len(finalists) if finalists else 0
            for kind, k in finalists[r:] + finalists[:r]:
                figs[(kind, k)].append(one(kind, json.loads(k))["gbps"])
        for kind in ("nvio", "fio", "ds"):
            ks = [(statistics.median(v), k) for (kk, k), v in figs.items() if kk == kind]
            if ks:
                best[kind] = json.loads(max(ks)[1])
        table = [(kind, json.loads(k), v) for (kind, k), v in figs.items()]
        if self.ds_ok:
            self.py.ask('{"cmd": "free"}')
        return best, table

    # -- validation ------------------------------------------------------------
    def validate(self, path, size, best_nvio, best_ds):
        """Each writer writes its own pattern; readers must see it."""
        checks = []
        writers = [("nvio-locked", lambda s: self.run_nvio("write", path, size, best_nvio,
                                                           "locked", s)),
                   ("nvio-pageable", lambda s: self.run_nvio("write", path, size, best_nvio,
                                                             "pageable", s)),
                   ("nvio-default", lambda s: self.run_nvio("write", path, size, "default",
                                                            "locked", s)),
                   ("python", lambda s: self.run_py("write", path, size, s))]
        readers = [("nvio-locked", lambda: self.run_nvio("read", path, size, best_nvio)),
                   ("nvio-pageable", lambda: self.run_nvio("read", path, size, best_nvio,
                                                           "pageable")),
                   ("python", lambda: self.run_py("read", path, size))]
        if best_ds is not None:
            writers.append(("deepspeed", lambda s: self.run_ds("write", path, size, best_ds,
                                                               s)))
            readers.append(("deepspeed", lambda: self.run_ds("read", path, size, best_ds)))
        seed = 1000
        for wi, (wname, w) in enumerate(writers):
            seed += 1
            w(seed)
            fsize = os.path.getsize(path)
            want = expected_sum(size, seed)
            # one reader per writer, rotating, plus nvio-locked every time
            rs = [readers[0]] + ([readers[wi % (len(readers) - 1) + 1]])
            for rname, rd in rs:
                got = rd()["sum"]
                ok = fsize == size and got == want
                checks.append("%s wrote, %s read back: size %s, checksum %s" %
                              (wname, rname, "ok" if fsize == size else
                               "WRONG (%d)" % fsize, "ok" if got == want else "WRONG"))
                if not ok:
                    self.bugs.append("validation failed: " + checks[-1])
        for c in checks:
            self.log("validate: " + c)
        return checks

    # -- the rounds ------------------------------------------------------------
    def rounds(self, op, path, size, best):
        conts = [("nvio-default", lambda: self.run_nvio(op, path, size, "default")),
                 ("nvio-best", lambda: self.run_nvio(op, path, size, best["nvio"])),
                 ("nvio-pageable", lambda: self.run_nvio(op, path, size, best["nvio"],
                                                         "pageable")),
                 ("fio-best", lambda: self.run_fio(op, path, size, best["fio"]))]
        if self.args.python_nvio:
            conts.append(("nvio-py", lambda: self.run_nvio_py(op, path, size, best["nvio"])))
        if self.ds_ok:
            conts.append(("ds-best", lambda: self.run_ds(op, path, size, best["ds"])))
        conts.append(("python", lambda: self.run_py(op, path, size)))
        per = {name: [] for name, _ in conts}
        for r in range(self.args.rounds):
            order = conts[r % len(conts):] + conts[:r % len(conts)]
            for name, fn in order:
                st0 = steal_s()
                per[name].append(fn())
                per[name][-1]["steal"] = steal_s() - st0
            self.log("  %s round %d: %s" % (op, r + 1, "  ".join(
                "%s %.2f" % (n, per[n][-1]["gbps"]) for n, _ in conts)))
        return per

    def prepare_file(self, path, size):
        if os.path.exists(path) and os.path.getsize(path) == size:
            return
        self.log("laying out %s (%d bytes)" % (path, size))
        with open(path, "wb") as f:
            chunk = b"\x5a" * (64 * MiB)
            left = size
            while left:
                n = min(left, len(chunk))
                f.write(chunk[:n])
                left -= n
            f.flush()
            os.fsync(f.fileno())

    def run_cell(self, disk, d, size):
        path = os.path.join(d, "nvio-core-%d" % size)
        self.prepare_file(path, size)
        cell = {"disk": disk, "dir": d, "size": size, "path": path}
        for op in ("write", "read"):
            self.log("%s %s %s: calibration sweep" % (disk, human(size), op))
            best, table = self.calibrate(op, path, size)
            self.log("%s %s %s: best %s" % (disk, human(size), op, best))
            cell[op] = {"best": best, "calib": table}
        if self.args.validate and not self.validated.get(disk):
            self.validated[disk] = True
            cell["validation"] = self.validate(
                path, size, cell["write"]["best"]["nvio"],
                cell["write"]["best"].get("ds"))
            if self.ds_ok:
                self.py.ask('{"cmd": "free"}')
        for op in ("write", "read"):
            self.log("%s %s %s: %d rounds" % (disk, human(size), op, self.args.rounds))
            cell[op]["rounds"] = self.rounds(op, path, size, cell[op]["best"])
            if self.ds_ok:
                self.py.ask('{"cmd": "free"}')
            self.nvio.ask("free")
        os.unlink(path)
        return cell


# ----------------------------------------------------------------------------
# Reporting

def human(n):
    for unit, v in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= v and n % v == 0:
            return "%d %s" % (n // v, unit)
    return "%d B" % n


def parse_size(s):
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": MiB, "G": GiB, "T": 1 << 40}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def cfg_str(kind, c):
    if kind == "nvio":
        if c == "default":
            return "default (1M, qd128, par1, auto engine, overlap off)"
        bs, qd, par, eng, single, overlap = c.split(":")
        return "%s, qd%s, par%s, %s%s, overlap %s" % (
            human(int(bs)).replace(" ", "").replace("MiB", "M").replace("KiB", "K"),
            qd, par, eng, ", single submit" if single == "1" else "",
            "on" if overlap == "1" else "off")
    if kind == "fio":
        return "%s, %s, qd%d, %d job%s%s" % (
            c["engine"], human(c["block"]).replace(" ", "").replace("MiB", "M").replace(
                "KiB", "K"), c["qd"], c["jobs"], "s" if c["jobs"] > 1 else "",
            ", huge pages" if c.get("huge") else "")
    return "%s, qd%d, par%d, overlap %s" % (
        human(c["block"]).replace(" ", "").replace("MiB", "M"), c["qd"], c["par"],
        "on" if c["overlap"] else "off")


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def ratios(a, b):
    return [x["gbps"] / y["gbps"] for x, y in zip(a, b)]


def cell_tables(cell, ds_ok):
    lines = []
    targets = []
    for op in ("write", "read"):
        c = cell[op]
        rd = c["rounds"]
        best = c["best"]
        fio = rd["fio-best"]
        ds = rd.get("ds-best")
        if ds:
            better = [f if f["gbps"] >= d["gbps"] else d for f, d in zip(fio, ds)]
        else:
            better = fio
        lines.append("")
        lines.append("**%s, %s, %s** (%s)" % (cell["disk"], human(cell["size"]), op,
                                              cell["dir"]))
        lines.append("")
        lines.append("| contender | config | GB/s median | min–max | CPU s/GB | "
                     "× fio-best | × DS-best | target | met |")
        lines.append("|---|---|---:|---:|---:|---:|---:|---|---|")
        tgt = {
            "nvio-best": ("≥ 1.0× max(fio, DS)", med(ratios(rd["nvio-best"], better)), 1.0),
            "nvio-default": ("≥ 0.9× nvio-best", med(ratios(rd["nvio-default"],
                                                           rd["nvio-best"])), 0.9),
            "nvio-pageable": ("≥ 0.9× nvio-best (locked)",
                              med(ratios(rd["nvio-pageable"], rd["nvio-best"])), 0.9),
        }
        if "nvio-py" in rd:
            tgt["nvio-py"] = ("≥ 1.0× max(fio, DS), from Python",
                              med(ratios(rd["nvio-py"], better)), 1.0)
        for name, runs in rd.items():
            g = [x["gbps"] for x in runs]
            cpu = [x["cpu"] for x in runs]
            if name.startswith("nvio"):
                conf = cfg_str("nvio", "default" if name == "nvio-default" else best["nvio"])
                if name == "nvio-pageable":
                    conf += "; malloc+1"
                if name == "nvio-py":
                    conf += "; Python AioHandle, its locked tensor, fd"
            elif name == "fio-best":
                conf = cfg_str("fio", best["fio"])
            elif name == "ds-best":
                conf = cfg_str("ds", best["ds"])
            else:
                conf = "buffered, " + ("write+fsync" if op == "write" else "readinto, cold")
            rf = "%.2f" % med(ratios(runs, fio))
            rdsv = "%.2f" % med(ratios(runs, ds)) if ds else "n/a"
            t, met = "", ""
            if name in tgt:
                desc, val, thr = tgt[name]
                t = "%s: **%.2f**" % (desc, val)
                met = "yes" if val >= thr else "**no**"
                targets.append((cell["disk"], human(cell["size"]), op, name, desc, val,
                                val >= thr))
            lines.append("| %s | %s | %.2f | %.2f–%.2f | %.3f | %s | %s | %s | %s |" % (
                name, conf, med(g), min(g), max(g), med(cpu), rf, rdsv, t, met))
    return lines, targets


def raw_lines(cell):
    out = []
    for op in ("write", "read"):
        rd = cell[op]["rounds"]
        names = list(rd)
        out.append("")
        out.append("%s %s %s — GB/s (CPU s/GB) per round:" % (cell["disk"],
                                                              human(cell["size"]), op))
        out.append("")
        out.append("| round | " + " | ".join(names) + " |")
        out.append("|---|" + "---:|" * len(names))
        for i in range(len(rd[names[0]])):
            out.append("| %d | " % (i + 1) + " | ".join(
                "%.2f (%.3f)" % (rd[n][i]["gbps"], rd[n][i]["cpu"]) for n in names) + " |")
        out.append("")
        out.append("CPU steal (s, all vCPUs) over each run, drop_caches included, max of "
                   "the rounds: " + ", ".join("%s %.2f" % (n, max(x.get("steal", 0)
                                                                 for x in rd[n]))
                                              for n in names))
        out.append("")
        out.append("Calibration sweep (GB/s, %s %s %s):" % (cell["disk"], human(cell["size"]),
                                                            op))
        out.append("")
        for kind, c, v in cell[op]["calib"]:
            mark = " ← chosen" if c == cell[op]["best"].get(kind) else ""
            out.append("- %s %s: %s%s" % (kind, cfg_str(kind, c),
                                          ", ".join("%.2f" % x for x in v), mark))
    return out


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except Exception:  # noqa: BLE001
        return "?"


def disk_info(disk, d):
    src = sh("findmnt -n -o SOURCE,FSTYPE,OPTIONS --target %s" % d)
    if disk == "real":
        dev = os.path.basename(src.split()[0]) if src else ""
        extra = "; scheduler %s; max_sectors_kb %s; max_segments %s" % (
            sh("cat /sys/block/%s/queue/scheduler" % dev),
            sh("cat /sys/block/%s/queue/max_sectors_kb" % dev),
            sh("cat /sys/block/%s/queue/max_segments" % dev))
    else:
        dev = os.path.basename(src.split()[0]) if src else ""
        extra = "; loop device over a file on tmpfs (bench/ramdisk.sh); max_sectors_kb %s" % (
            sh("cat /sys/block/%s/queue/max_sectors_kb" % dev))
    return "- %s disk: %s — %s%s" % (disk, d, src, extra)


def machine_info(bench, dirs):
    mem = sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo")
    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    info = [
        "- date: %s" % datetime.datetime.now().strftime("%Y-%m-%d %H:%M %Z").strip(),
        "- machine: %s cores (%s), %s RAM, kernel %s, %s" % (
            os.cpu_count(), cpu, mem, platform.release(), platform.machine()),
        "- nvio: %s (git %s%s), engine default %s" % (
            bench.lib, sh("git -C %s rev-parse --short HEAD" % REPO),
            " + uncommitted changes in src/" if sh(
                "git -C %s status --porcelain src include" % REPO) else "",
            "io_uring"),
        "- fio: %s; DeepSpeed: %s; Python %s; torch %s" % (
            sh("fio --version"), bench.ds_version if bench.ds_ok else
            "not available (%s)" % bench.ds_why, platform.python_version(),
            sh("%s -c 'import torch;print(torch.__version__)'" % sys.executable)),
    ]
    info += bench.disk_lines
    note = bench.guest["note"]
    if "reported_mib" in bench.guest:
        note += "; reported to the host during the run: %d MiB" % bench.guest["reported_mib"]
    info.append("- %s (bench/guestmem.py)" % note)
    info.append("- %s (bench/hugepages.py)" % bench.huge_note)
    return info


def cpu():
    """CPU seconds (user + system) of this process so far."""
    r = os.times()
    return r.user + r.system


def free_port():
    """A TCP port free on 127.0.0.1 now (a process group's store)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def fio_rig(huge_bytes, log):
    """For a benchmark that compares with fio from its own driver (run_fio,
    prepare_file): a Bench to call them on, with the VM's free page
    reporting paused and huge_bytes of huge pages reserved for fio's
    buffers (huge_path None where none could be had: fio then runs with
    4 KiB pages). Yields (bench, the guest's notes)."""
    fio = Bench.__new__(Bench)
    fio.args = argparse.Namespace(quick=False)
    fio.log = log
    with guestmem.page_reporting_paused(True) as guest, \
            hugepages.reserved(huge_bytes, log) as huge:
        fio.huge_path = huge
        yield fio, guest


def ratio_table(heading, per, base, fio="fio-best", cpu="CPU s/GB"):
    """A report's table of contenders {name: [{"gbps", "cpu"} per round]}
    under the line ``heading``: medians, spread, and the median of per-round
    ratios to ``base`` and to ``fio`` (../shared/BENCHMARKING.md). Markdown
    lines, a blank one last."""
    med = statistics.median
    out = [heading, "",
           "| contender | GB/s median | min–max | %s | × %s | × fio-best | per-round GB/s |"
           % (cpu, base), "|---|---:|---:|---:|---:|---:|---|"]
    for n, v in per.items():
        g = [x["gbps"] for x in v]
        out.append("| %s | %.2f | %.2f–%.2f | %.3f | %.2f | %.2f | %s |" % (
            n, med(g), min(g), max(g), med([x["cpu"] for x in v]),
            med([x["gbps"] / y["gbps"] for x, y in zip(v, per[base])]),
            med([x["gbps"] / y["gbps"] for x, y in zip(v, per[fio])]),
            " ".join("%.2f" % x for x in g)))
    return out + [""]


def emit(lines, path, append=False):
    """Prints a report's markdown lines and, with a path, writes them there
    (every bench script's last step); ``append``: as one more section of
    the file (A/B scripts that add a section per run)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if path:
        with open(path, "a" if append else "w") as f:
            f.write(("\n" if append else "") + text)


def write_report(bench, cells, dirs, path, argv):
    lines = ["# nvio core benchmark — %s" % datetime.date.today().isoformat(), ""]
    lines += machine_info(bench, dirs)
    lines += [
        "- command: `%s`" % " ".join(shlex.quote(a) for a in argv),
        "- wall time: %.0f min" % ((time.time() - bench.t_start) / 60),
        "- rounds: %d per cell, contenders interleaved and rotated each round; "
        "calibration: %d pass(es) of each sweep, then the top %d of each "
        "contender %d more passes, best median chosen" % (
            bench.args.rounds, bench.args.calib_reps, bench.args.runoff,
            bench.args.runoff_passes),
        "",
        "Method: every contender overwrites (no truncation) the same preallocated file; "
        "writes end with fsync (fio `--end_fsync=1`); before every run the page cache is "
        "dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`). nvio, fio and DeepSpeed use "
        "O_DIRECT; python goes through the page cache. GB = 10^9 bytes. Each contender "
        "times only its transfer (buffers and handles made before, untimed). CPU s/GB = "
        "user+sys of the process over the transfer (getrusage RUSAGE_SELF, all threads; "
        "fio's usr_cpu+sys_cpu × job runtime) per GB; kernel threads (loop device "
        "workers, block-layer completions) are not counted for anyone. Ratios are the "
        "median of per-round ratios; the nvio-best target compares each round with the "
        "better of that round's fio-best and DS-best.",
        "",
        "Contenders: nvio-default = `nvio_config_init()` defaults, locked buffer "
        "(nvio_mem_alloc); nvio-best = best config of the calibration sweep, locked "
        "buffer; nvio-pageable = nvio-best's config with a malloc'd buffer at address+1 "
        "(unlocked, unaligned), kept across rounds like the locked one; fio-best = best of the fio sweep; DS-best = best of the "
        "DeepSpeed aio_handle sweep (block 1M/8M × qd 32/128 × intra_op_parallelism 1/2, "
        "overlap on) with its own new_cpu_locked_tensor buffer, + os.fsync for writes; "
        "python = `open(...,'r+b').write(buf)` + `os.fsync`, `open(...,'rb').readinto(buf)`. "
        "nvio runs through bench/nvio_xfer.c (public API only).",
        "",
        "## Results",
    ]
    all_targets = []
    for cell in cells:
        tl, targets = cell_tables(cell, bench.ds_ok)
        lines += tl
        all_targets += targets
    lines += ["", "## Targets", "", "| disk | size | op | contender | target | median ratio | met |",
              "|---|---|---|---|---|---:|---|"]
    for disk, size, op, name, desc, val, ok in all_targets:
        lines.append("| %s | %s | %s | %s | %s | %.2f | %s |" % (
            disk, size, op, name, desc, val, "yes" if ok else "**no**"))
    met = sum(1 for t in all_targets if t[-1])
    lines += ["", "%d of %d targets met." % (met, len(all_targets))]
    if bench.bugs:
        lines += ["", "## Problems found", ""] + ["- " + b for b in bench.bugs]
    if bench.notes:
        lines += ["", "## Notes", ""] + ["- " + n for n in bench.notes]
    lines += ["", "## Raw figures"]
    for cell in cells:
        if cell.get("validation"):
            lines += ["", "Validation on %s (%s):" % (cell["disk"], human(cell["size"])), ""]
            lines += ["- " + v for v in cell["validation"]]
        lines += raw_lines(cell)
    lines.append("")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return all_targets


# ----------------------------------------------------------------------------

def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main()
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1G,4G", help="comma list (default 1G,4G)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--disk", choices=("real", "ram", "both"), default="both")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 512M on both disks, 3 rounds, reduced sweeps, "
                         "no validation (unless --validate)")
    ap.add_argument("--calib-reps", type=int, default=1,
                    help="passes of each sweep in the calibration (default 1)")
    ap.add_argument("--runoff", type=int, default=3,
                    help="after the sweep, the top N configs of each contender "
                         "(default 3) run --runoff-passes more passes")
    ap.add_argument("--runoff-passes", type=int, default=2,
                    help="extra passes of the runoff (default 2; 0: none)")
    ap.add_argument("--real-dir", default="/root/nvio-bench",
                    help="directory on the real disk (default /root/nvio-bench)")
    ap.add_argument("--ram-size", default="10G", help="tmpfs size for the RAM disk")
    ap.add_argument("--no-deepspeed", action="store_true")
    ap.add_argument("--no-python-nvio", dest="python_nvio", action="store_false",
                    help="leave out nvio-py (nvio-best's config through the Python "
                         "package's AioHandle; needs `import nvio`)")
    ap.add_argument("--validate", action="store_true", default=None,
                    help="check every writer's and reader's bytes once per disk "
                         "(default on, off with --quick)")
    ap.add_argument("--no-validate", dest="validate", action="store_false")
    ap.add_argument("--lib", help="use this libnvio.a instead of building one")
    ap.add_argument("--build-dir", default="/tmp/nvio-core-bench",
                    help="where libnvio and the driver are built")
    ap.add_argument("--out", help="report path (default bench/results/core-DATE.md)")
    ap.add_argument("--no-huge", action="store_true",
                    help="leave fio's huge-page buffer runs out of its sweep")
    ap.add_argument("--keep-page-reporting", action="store_true",
                    help="leave the VM's free page reporting on (see bench/guestmem.py)")
    args = ap.parse_args()
    if args.quick:
        args.sizes = "512M"
        args.rounds = 3 if args.rounds == 5 else args.rounds
    if args.validate is None:
        args.validate = not args.quick
    if os.geteuid() != 0:
        print("core_bench.py: needs root (drop_caches, the RAM disk)", file=sys.stderr)
        return 2
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    out = args.out or os.path.join(HERE, "results", "core-%s%s.md" % (
        datetime.date.today().isoformat(), "-quick" if args.quick else ""))

    import signal
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # tear down in finally
    signal.signal(signal.SIGHUP, lambda *a: sys.exit(129))
    bench = Bench(args)
    bench.validated = {}
    bench.disk_lines = []
    bench.build()
    cells = []
    dirs = []
    t_start = bench.t_start = time.time()
    with guestmem.page_reporting_paused(not args.keep_page_reporting) as bench.guest:
        run_all(bench, args, sizes, dirs, cells, out)
    # the final report, once the amount reported to the host is known
    targets = write_report(bench, cells, dirs, out, sys.argv)
    bench.log("done in %.0f s; report: %s" % (time.time() - t_start, out))
    for disk, size, op, name, desc, val, ok in targets:
        print("%-4s %-6s %-5s %-13s %-26s %.2f %s" % (disk, size, op, name, desc, val,
                                                   "yes" if ok else "NO"))
    return 0


def run_all(bench, args, sizes, dirs, cells, out):
    # fio's largest buffers: 8 MiB x qd 128 (its jobs map the same file)
    with hugepages.reserved(0 if args.no_huge else 8 * MiB * 128 + 64 * MiB,
                            bench.log) as bench.huge_path:
        bench.huge_note = ("fio sweep with and without huge-page buffers "
                           "(--mem=mmaphuge on hugetlbfs)" if bench.huge_path else
                           "fio sweep WITHOUT huge-page buffers" +
                           (" (--no-huge)" if args.no_huge else " (no huge pages to be had)"))
        run_all_disks(bench, args, sizes, dirs, cells, out)


def run_all_disks(bench, args, sizes, dirs, cells, out):
    with contextlib.ExitStack() as stack:     # workers stop before the RAM disk goes
        ram = (stack.enter_context(ramdisk.mounted(args.ram_size, bench.log))
               if args.disk in ("ram", "both") else None)
        stack.callback(bench.stop_workers)
        bench.start_workers()
        if args.disk in ("real", "both"):
            os.makedirs(args.real_dir, exist_ok=True)
            dirs.append(("real", args.real_dir))
        if ram is not None:
            dirs.append(("ram", ram))
        bench.disk_lines = [disk_info(disk, d) for disk, d in dirs]
        for disk, d in dirs:
            for size in sizes:
                cells.append(bench.run_cell(disk, d, size))
                # a partial report after every cell
                write_report(bench, cells, dirs, out, sys.argv)


if __name__ == "__main__":
    sys.exit(main())
