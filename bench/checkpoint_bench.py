#!/usr/bin/env python3
"""bench/checkpoint_bench.py - nvio.save / nvio.async_save / nvio.load against
torch.save / torch.load, DeepSpeed's FastFileWriter and fio-best, on the
real disk and the RAM disk, in interleaved rotated rounds (issue 18's
Benchmark; ../shared/BENCHMARKING.md rules 1-7).

States (random values, nothing downloaded; one at a time in memory):

  llama-adamw   a Llama-style fp32 model (bench/vec_sizes.py's shapes with
                hidden 1024, 10 layers, 16 heads, 4 kv heads, intermediate
                2816, vocab 32000: 177M parameters) plus its AdamW state
                (exp_avg, exp_avg_sq, step per parameter, as
                AdamW.state_dict() gives it): {"model": ..., "optimizer":
                ...}, 2.13 GB in 273 tensors. The model is scaled down so
                that model + AdamW stays ~2 GiB (the issue's 2 GiB is the
                whole state, AdamW's two moments included).
  small-5000    5,000 fp32 tensors of 0.2-0.65 MB (uniform), 2.15 GB.

Saves (every one durable: fsync of the file; nvio's also rename + fsync of
the directory; page cache dropped before each):

  torch.save        torch.save(sd, p), then fsync of p
  torch.save>nvio   with nvio.open(p, "wb") as f: torch.save(sd, f)
  nvio.save         nvio.save(sd, p)
  nvio.save(spare)  nvio.save(sd, p, spare=True): into the blocks of the
                    spare .p.nvio-spare (an older version of p, kept by
                    the previous spare save), swapped in at commit. The
                    spare exists before the first timed round (two spare
                    saves in the validation); the other writers' plain
                    renames of p leave it alone, so every timed spare save
                    overwrites blocks written before. It runs right after
                    fio-best, which frees no blocks: on the real disk
                    (ext4 -o discard, thin-provisioned below) the blocks a
                    save frees (the file it replaced) are discarded during
                    the next seconds and slow whatever writes next (1 GiB
                    measured: 1.7-2.0 GB/s for a spare save right after a
                    plain one, 3.1-3.2 after an 8 s pause, 3.3-4.1 after
                    another spare save); a spare save frees nothing, so in
                    a loop of spare saves none is paid. (Rotation keeps the
                    cyclic order, so each contender always follows the
                    same one.)
  async.return      nvio.async_save (own AsyncCheckpointer, pool reused
                    across rounds): time until the call returns
  async.durable     the same call: time until its future resolves
  memcpy            one copy of every storage into a reused, pre-faulted
                    buffer of the state's size (the async pool's, idle between
                    saves): what async.return is held to
  ds-fastwriter     torch.save(sd, deepspeed.io.FastFileWriter(...)) + close
                    (which fsyncs), its aio_handle 8M x qd32 x 1, 64 MiB
                    double buffer; only with --deepspeed DIR
  fio-best          per round, the better of libaio 1M x QD32 x 1 job and
                    8M x QD128 x 2 jobs, both with huge-page buffers
                    (bench/hugepages.py), O_DIRECT, --end_fsync=1,
                    overwriting the existing checkpoint file (its size
                    rounded down to 16 MiB)
  fio-new           the same two configs writing a file that does not exist
                    yet (removed before each run, untimed)

Loads (page cache dropped before each; results compared once, untimed):

  torch.load        torch.load(p)               (weights_only=True)
  torch.load-mmap   torch.load(p, mmap=True), then one byte of every page
                    of every storage touched
  nvio.load         nvio.load(p)
  fio-best          the same two configs, reading

GB/s = the state's tensor bytes / seconds for checkpoint contenders (each
file also holds its pickle and zip records; nvio's pads records to 4 KiB),
fio's own bytes / its seconds for fio. CPU s/GB = user + system seconds of
this process (getrusage RUSAGE_SELF, every thread) over the run; fio's
from its own usr/sys figures (as in core_bench.py); kernel threads (the
loop device's worker on the RAM disk) count for no one. Ratios are the
median of per-round ratios.

Needs root (drop_caches, hugetlbfs, the RAM disk). Peak memory of the
process: the state + the async snapshot pool (2 x the state, ~4.3 GB)
while saving, the state + a loaded copy while loading; the RAM disk holds up to three checkpoints
(the file, its spare and a new temporary: --ram-size 7G for the full-size states;
fstrim after every run gives freed blocks back to its tmpfs).

    python3 bench/checkpoint_bench.py --rounds 5 --out bench/results/checkpoint-DATE.md
    python3 bench/checkpoint_bench.py --quick      # 1 round, small states
"""
import argparse
import contextlib
import datetime
import gc
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
import types
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import core_bench  # noqa: E402
import guestmem  # noqa: E402
import hugepages  # noqa: E402
import ramdisk  # noqa: E402
import vec_sizes  # noqa: E402

import torch  # noqa: E402

try:
    import nvio
except ImportError:
    sys.path.insert(0, os.path.join(REPO, "python"))
    import nvio
from nvio.checkpoint._async import AsyncCheckpointer  # noqa: E402

MiB = 1 << 20
FIO_CFGS = [dict(engine="libaio", block=MiB, qd=32, jobs=1, huge=1),
            dict(engine="libaio", block=8 * MiB, qd=128, jobs=2, huge=1)]


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


# --- states ------------------------------------------------------------------

def llama_adamw(scale=1.0):
    """Model + AdamW state dict of a Llama-style fp32 model (see the docstring)."""
    layers = max(1, int(round(10 * scale)))
    vocab = 32000 if scale >= 0.5 else 4000
    shapes, _ = vec_sizes.state_dict(hidden=1024, layers=layers, heads=16, kv_heads=4,
                                     inter=2816, vocab=vocab, dtype_bytes=4)
    g = torch.Generator().manual_seed(0)

    def rnd(shape, std):
        t = torch.empty(shape, dtype=torch.float32)
        return t.uniform_(-std, std, generator=g)

    model = {n: rnd(s, 0.02) for n, s in shapes}
    state = {}
    for i, (n, s) in enumerate(shapes):
        state[i] = {"step": torch.tensor(1000.0), "exp_avg": rnd(s, 1e-3),
                    "exp_avg_sq": rnd(s, 1e-6).abs_()}
    groups = [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
               "amsgrad": False, "foreach": None, "maximize": False, "capturable": False,
               "differentiable": False, "fused": None, "decoupled_weight_decay": True,
               "params": list(range(len(shapes)))}]
    return {"model": model, "optimizer": {"state": state, "param_groups": groups}}


def small_tensors(n=5000, total=2 << 30):
    g = torch.Generator().manual_seed(1)
    mean = total // n // 4
    sizes = torch.randint(mean // 2, mean * 3 // 2, (n,), generator=g).tolist()
    return {"t.%d" % i: torch.empty(k, dtype=torch.float32).uniform_(-1, 1, generator=g)
            for i, k in enumerate(sizes)}


def storages(obj):
    """The distinct storages of every tensor in a nested state (by data_ptr)."""
    out = {}

    def walk(o):
        if isinstance(o, torch.Tensor):
            s = o.untyped_storage()
            out.setdefault(s.data_ptr(), s)
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
    walk(obj)
    return list(out.values())


def flat(obj, pre=""):
    if isinstance(obj, torch.Tensor):
        yield pre, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from flat(v, "%s/%s" % (pre, k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from flat(v, "%s/%d" % (pre, i))


def same(a, b):
    fa, fb = dict(flat(a)), dict(flat(b))
    return fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)


# --- measuring -----------------------------------------------------------------

def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fsync_path(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fstrim(d):
    subprocess.run(["fstrim", d], capture_output=True)


class Cell:
    """One state on one disk: the contenders and their rounds."""

    def __init__(self, a, disk, d, name, sd, fio):
        self.a, self.disk, self.dir, self.name, self.sd, self.fio = a, disk, d, name, sd, fio
        self.p = os.path.join(d, "nvio-ckbench.pt")
        self.pnew = os.path.join(d, "nvio-ckbench-fio-new.bin")
        self.spare = os.path.join(d, ".nvio-ckbench.pt.nvio-spare")
        self.st = storages(sd)
        self.nbytes = sum(s.nbytes() for s in self.st)
        self.notes = []
        self.checks = []
        self.ckpt = None
        self.copybuf = None
        self.ds = None

    def gbps(self, secs, cpu, n=None):
        n = self.nbytes if n is None else n
        return dict(gbps=n / secs / 1e9, secs=secs, cpu=cpu / (n / 1e9))

    def timed(self, fn):
        core_bench.drop_caches()
        c0, t0 = cpu_self(), time.perf_counter()
        out = fn()
        r = self.gbps(time.perf_counter() - t0, cpu_self() - c0)
        del out
        gc.collect()
        if self.disk == "ram":
            fstrim(self.dir)
        return r

    # -- saves
    def torch_save(self):
        torch.save(self.sd, self.p)
        fsync_path(self.p)

    def torch_save_nvio(self):
        with nvio.open(self.p, "wb") as f:
            torch.save(self.sd, f)

    def nvio_save(self):
        nvio.save(self.sd, self.p)

    def nvio_save_spare(self):
        nvio.save(self.sd, self.p, spare=True)

    def async_run(self):
        core_bench.drop_caches()
        c0, t0 = cpu_self(), time.perf_counter()
        fut = self.ckpt.save(self.sd, self.p)
        t1, c1 = time.perf_counter(), cpu_self()
        fut.result()
        t2, c2 = time.perf_counter(), cpu_self()
        if self.disk == "ram":
            fstrim(self.dir)
        return self.gbps(t1 - t0, c1 - c0), self.gbps(t2 - t0, c2 - c0)

    def memcpy(self):
        dst = self.copybuf
        off = 0
        for s in self.st:
            n = s.nbytes()
            dst[off:off + n].copy_(torch.empty(0, dtype=torch.uint8).set_(s, 0, (n,), (1,)))
            off += n

    def ds_save(self):
        w = self.ds["FastFileWriter"](file_path=self.p, config=self.ds["config"])
        torch.save(self.sd, w)
        w.close()

    def fio_best(self, op, path=None, new=False):
        best = None
        for c in FIO_CFGS:
            target = path or self.p
            if new:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(target)
                if self.disk == "ram":
                    fstrim(self.dir)
            n = self.fio_bytes
            r = self.fio.run_fio(op, target, n, c)
            if best is None or r["gbps"] > best["gbps"]:
                best = r
        if new:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            if self.disk == "ram":
                fstrim(self.dir)
        return dict(gbps=best["gbps"], cpu=best["cpu"], secs=best["secs"])

    # -- loads
    def touch_mmap(self):
        sd = torch.load(self.p, mmap=True)
        tot = 0
        for s in storages(sd):
            n = s.nbytes()
            if n:
                u = torch.empty(0, dtype=torch.uint8).set_(s, 0, (n,), (1,))
                tot += int(u[::4096].sum())
        return sd

    # -- the cell
    def setup(self):
        a = self.a
        self.ckpt = AsyncCheckpointer()
        if a.deepspeed:
            self.ds = ds_setup(a)
        # validation, untimed: every writer once, read back by torch.load;
        # nvio's files also through zipfile's CRC check
        writers = [("torch.save", self.torch_save), ("torch.save>nvio", self.torch_save_nvio),
                   ("nvio.save", self.nvio_save),
                   ("nvio.async_save", lambda: self.ckpt.save(self.sd, self.p).result()),
                   # twice: the first makes the spare, the second writes into it
                   ("nvio.save(spare)", self.nvio_save_spare),
                   ("nvio.save(spare)", self.nvio_save_spare)]
        # memcpy's target: the async pool's buffer, idle between saves (so
        # that the copy runs into the same warm memory and no third copy of
        # the state is held)
        if self.ds:
            writers.append(("ds-fastwriter", self.ds_save))
        for wn, w in writers:
            w()
            ok = same(torch.load(self.p), self.sd)
            msg = "%s -> torch.load: %s" % (wn, "equal" if ok else "DIFFERENT")
            if wn.startswith("nvio"):
                with zipfile.ZipFile(self.p) as z:
                    bad = z.testzip()
                msg += "; zipfile CRC check: %s" % ("ok" if bad is None else "BAD " + bad)
                ok = ok and bad is None
                got = nvio.load(self.p)
                ok2 = same(got, self.sd)
                del got
                msg += "; nvio.load: %s" % ("equal" if ok2 else "DIFFERENT")
                ok = ok and ok2
            if wn == "nvio.save(spare)":
                ok = ok and os.path.exists(self.spare)
                msg += "; spare %s" % ("there" if os.path.exists(self.spare) else "MISSING")
            self.checks.append(msg)
            log("validate %s %s: %s" % (self.disk, self.name, msg))
            if not ok:
                raise RuntimeError("validation failed: " + msg)
            gc.collect()
        self.copybuf = torch.frombuffer(self.ckpt._free[0], dtype=torch.uint8)
        self.fsize = os.path.getsize(self.p)
        # no file of the state is shorter than its tensor bytes
        self.fio_bytes = self.nbytes // (16 * MiB) * (16 * MiB)

    def run_saves(self):
        conts = [("torch.save", lambda: self.timed(self.torch_save)),
                 ("torch.save>nvio", lambda: self.timed(self.torch_save_nvio)),
                 ("nvio.save", lambda: self.timed(self.nvio_save)),
                 ("async", self.async_run),
                 ("memcpy", lambda: self.timed(self.memcpy)),
                 ("fio-best", lambda: self.fio_best("write")),
                 # after a contender that frees no blocks (see the docstring)
                 ("nvio.save(spare)", lambda: self.timed(self.nvio_save_spare)),
                 ("fio-new", lambda: self.fio_best("write", self.pnew, new=True))]
        if self.ds:
            conts.insert(3, ("ds-fastwriter", lambda: self.timed(self.ds_save)))
        per = rounds(self.a.rounds, conts, "%s %s save" % (self.disk, self.name))
        per["async.return"] = [x[0] for x in per["async"]]
        per["async.durable"] = [x[1] for x in per.pop("async")]
        self.ckpt.close()
        self.ckpt = self.copybuf = None
        gc.collect()
        return per

    def run_loads(self):
        self.nvio_save()                  # the file every load reads
        self.fsize = os.path.getsize(self.p)
        conts = [("torch.load", lambda: self.timed(lambda: torch.load(self.p))),
                 ("torch.load-mmap", lambda: self.timed(self.touch_mmap)),
                 ("nvio.load", lambda: self.timed(lambda: nvio.load(self.p))),
                 ("fio-best", lambda: self.fio_best("read"))]
        return rounds(self.a.rounds, conts, "%s %s load" % (self.disk, self.name))


def rounds(n, conts, what):
    per = {name: [] for name, _ in conts}
    for r in range(n):
        order = conts[r % len(conts):] + conts[:r % len(conts)]
        for name, fn in order:
            per[name].append(fn())
        log("%s round %d: %s" % (what, r + 1, "  ".join(
            "%s %.2f" % (k, (v[-1][1] if isinstance(v[-1], tuple) else v[-1])["gbps"])
            for k, v in per.items())))
    return per


def ds_setup(a):
    sys.path.insert(0, a.deepspeed)
    with contextlib.redirect_stdout(sys.stderr):
        import deepspeed.io.fast_file_writer as ffw
        from deepspeed.io import FastFileWriter, FastFileWriterConfig
        from deepspeed.ops.op_builder import AsyncIOBuilder
    try:
        ffw.UtilsBuilder().load()
    except ValueError:
        # DeepSpeed's CPU accelerator has no UtilsBuilder op ("not implemented
        # on CPU backend"); FastFileWriter uses only its cast_to_byte_tensor,
        # a byte view of each tensor's memory: the same in Python
        def cast(x):
            if isinstance(x, torch.Tensor):
                return x.reshape(-1).view(torch.uint8)
            return [cast(t) for t in x]

        class _Utils:
            def load(self, *a, **k):
                return types.SimpleNamespace(cast_to_byte_tensor=cast)
        ffw.UtilsBuilder = _Utils
        h = AsyncIOBuilder().load(verbose=False).aio_handle(8 * MiB, 32, False, True, 1)
    buf = h.new_cpu_locked_tensor(64 * MiB, torch.empty(0, dtype=torch.uint8))
    return {"FastFileWriter": FastFileWriter, "handle": h, "buf": buf,
            "config": FastFileWriterConfig(dnvme_handle=h, pinned_tensor=buf,
                                           double_buffer=True)}


# --- report --------------------------------------------------------------------

def med(xs):
    return statistics.median(xs)


def table(per, base, fio, title):
    return core_bench.ratio_table("**%s**" % title, per, base, fio)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--real-dir", default="/var/tmp/nvio-ckbench")
    ap.add_argument("--ram-size", default="7G",
                    help="the RAM disk holds the checkpoint, its spare and a temporary")
    ap.add_argument("--disk", choices=("real", "ram", "both"), default="both")
    ap.add_argument("--state", choices=("llama-adamw", "small-5000", "both"), default="both")
    ap.add_argument("--deepspeed", metavar="DIR",
                    help="a directory holding deepspeed (pip install --target DIR "
                         "deepspeed): adds its FastFileWriter")
    ap.add_argument("--quick", action="store_true", help="1 round, states of ~1/8 size")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="state size factor (layers of the model, bytes of the small "
                         "tensors; 0.5 keeps a run under ~4 GiB of memory)")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch.set_num_threads (default 1: on this shared 2-core VM "
                         "OpenMP's spinning threads made each small copy_ take ms)")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(a.torch_threads)
    if a.quick:
        a.rounds = 1
    if os.geteuid() != 0:
        sys.exit("checkpoint_bench.py: needs root (drop_caches, hugetlbfs, the RAM disk)")
    import signal
    signal.signal(signal.SIGTERM, lambda *x: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *x: sys.exit(129))
    t_start = time.time()
    fio = core_bench.Bench.__new__(core_bench.Bench)
    fio.args = argparse.Namespace(quick=False)
    fio.log = log
    scale = 0.125 if a.quick else a.scale
    states = [("llama-adamw", lambda: llama_adamw(scale)),
              ("small-5000", lambda: small_tensors(5000, int((2 << 30) * scale)))]
    states = [s for s in states if a.state in (s[0], "both")]
    disks = [d for d in ("real", "ram") if a.disk in (d, "both")]
    res = []
    disk_lines = []
    with guestmem.page_reporting_paused(True) as guest, \
            hugepages.reserved(8 * MiB * 128 + 64 * MiB, log) as fio.huge_path, \
            contextlib.ExitStack() as stack:
        dirs = []
        if "real" in disks:
            os.makedirs(a.real_dir, exist_ok=True)
            dirs.append(("real", a.real_dir))
        if "ram" in disks:
            dirs.append(("ram", stack.enter_context(ramdisk.mounted(a.ram_size, log))))
        disk_lines = [core_bench.disk_info(k, d) for k, d in dirs]
        for sname, make in states:
            log("making %s" % sname)
            sd = make()
            for disk, d in dirs:
                cell = Cell(a, disk, d, sname, sd, fio)
                try:
                    cell.setup()
                    saves = cell.run_saves()
                    loads = cell.run_loads()
                finally:
                    for x in (cell.p, cell.pnew, cell.spare):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(x)
                res.append((disk, sname, cell.nbytes, len(cell.st), cell.fsize,
                            cell.fio_bytes, cell.checks, saves, loads))
                # a partial report after every cell
                report(a, res, disk_lines, guest, t_start,
                       resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                       quiet=True)
                del cell
                gc.collect()
            del sd
            gc.collect()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    report(a, res, disk_lines, guest, t_start, peak)


def report(a, res, disk_lines, guest, t_start, peak, quiet=False):
    now = datetime.datetime.now(datetime.timezone.utc)
    cpu = core_bench.sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    out = ["# Checkpoints: nvio.save / async_save / load against torch and fio — %s"
           % now.date(), "",
           "- date: %s UTC; wall %.0f min" % (now.strftime("%Y-%m-%d %H:%M"),
                                             (time.time() - t_start) / 60),
           "- machine: %d cores (%s), %.1f GiB RAM, kernel %s; load average %.2f at the end "
           "(above ~0.5: other jobs shared the machine)" % (
               os.cpu_count(), cpu, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
               / (1 << 30), platform.release(), os.getloadavg()[0]),
           "- torch %s; Python %s; nvio %s (%s); fio %s" % (
               torch.__version__, platform.python_version(), nvio.__version__,
               os.path.dirname(nvio.__file__), core_bench.sh("fio --version")),
           "- nvio commit: %s" % core_bench.sh("git -C %s log -1 --format='%%h %%s'" % REPO),
           "- command: `%s`" % " ".join(shlex.quote(x) for x in ["python3"] + sys.argv)]
    out += disk_lines
    out += ["- %s (bench/guestmem.py)" % guest["note"],
            "- %d rounds, contenders interleaved and rotated each round; page cache dropped "
            "before every run; every save durable; ratios = median of per-round ratios; "
            "GB = 10^9 bytes of tensor data (fio: its own bytes)" % a.rounds,
            "- torch.set_num_threads(%d) for every contender (--torch-threads)" % a.torch_threads,
            "- peak RSS of the benchmark process: %.1f GiB (the state + the async snapshot "
            "pool while saving; the state + a loaded copy while loading)" % (peak / (1 << 30)), ""]
    summary = ["## Targets", "",
               "| disk | state | nvio.save × fio-best | nvio.save × fio-new | nvio.save × torch.save "
               "| nvio.load × fio-best | nvio.load × torch.load | async.return × memcpy time "
               "| nvio.save(spare) × fio-best | nvio.save(spare) × nvio.save |",
               "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    body = []
    for disk, sname, nbytes, nst, fsize, fbytes, checks, saves, loads in res:
        def r(per, x, y, inv=False):
            return med([(b["secs"] / a_["secs"]) if inv else (a_["gbps"] / b["gbps"])
                        for a_, b in zip(per[x], per[y])])
        summary.append("| %s | %s | **%.2f** | %.2f | %.1f | **%.2f** | %.1f | %.2f "
                       "| **%.2f** | %.2f |" % (
            disk, sname, r(saves, "nvio.save", "fio-best"), r(saves, "nvio.save", "fio-new"),
            r(saves, "nvio.save", "torch.save"), r(loads, "nvio.load", "fio-best"),
            r(loads, "nvio.load", "torch.load"),
            med([x["secs"] / y["secs"] for x, y in zip(saves["async.return"],
                                                       saves["memcpy"])]),
            r(saves, "nvio.save(spare)", "fio-best"), r(saves, "nvio.save(spare)", "nvio.save")))
        body += ["## %s disk, %s: %d storages, %d bytes of tensors; nvio's file %d bytes; "
                 "fio moves %d bytes" % (disk, sname, nst, nbytes, fsize, fbytes), ""]
        body += ["- validation: " + "; ".join(checks), ""]
        body += table(saves, "torch.save", "fio-best", "save (%s, %s)" % (disk, sname))
        body += table(loads, "torch.load", "fio-best", "load (%s, %s)" % (disk, sname))
    out += summary + ["", "async.return × memcpy time: seconds until async_save returned / "
                      "seconds of one memcpy of the state (≤ 1 is the target).", ""] + body
    if quiet:
        if a.out:
            with open(a.out, "w") as f:
                f.write("\n".join(out) + "\n")
        return
    core_bench.emit(out, a.out)


if __name__ == "__main__":
    main()
