#!/usr/bin/env python3
"""bench/save_bench.py - issue 33's save matrix: nvio's checkpoint writers
against fio writing a new file (fio-new) and fio overwriting laid-out blocks
(fio-best), for four shapes of state and the ONE-tensor control, on the real
disk, a RAM-backed ext4 and a RAM-backed xfs, in interleaved rotated rounds
(../shared/BENCHMARKING.md rules 1-10). It writes its markdown itself.

States (random values, nothing downloaded; one at a time in memory; sizes
at --scale 1):

  llama22      22 fp32 tensors of 64-180 MB, 2.2 GB: embed and lm_head
               [32000, 1408] (180 MB), 10 x attention [4096, 4096] (67 MB)
               and 10 x MLP [7168, 4096] (117 MB); --scale scales the rows
  small5000    5,000 fp32 tensors of 0.2-0.65 MB (uniform, mean 430 KB),
               2.15 GB (checkpoint_bench.small_tensors)
  mixed        a bf16 Llama-style model (hidden 1024, 12 layers, vocab 32000:
               201M parameters, bench/vec_sizes.py) with its AdamW state
               (fp32 exp_avg, exp_avg_sq, a 0-dim fp32 step per parameter,
               param_groups), plus int64 tensors (a sampler's permutation of
               24M indices, a step counter, per-layer int64 buffers): ~2.2 GB
               in ~450 tensors of fp32/bf16/int64
  tiny50000    50,000 fp32 tensors of 1-1024 elements (uniform; 4 B-4 KiB),
               ~100 MB of tensor bytes; --scale scales the element count,
               never the number of tensors

Save rows (every one durable; page cache dropped before each; "new" =
the destination is replaced by a file written into fresh blocks, "spare" =
written into the blocks of the previous version, nvio's spare=True):

  fio-new        the better of libaio 1M x QD32 x 1 job and 8M x QD128 x 2
                 jobs, huge-page buffers (bench/hugepages.py), O_DIRECT,
                 end_fsync, writing a file that does not exist yet (removed
                 first, untimed; --fallocate=none); the state's tensor bytes
                 rounded down to 16 MiB (1 MiB below 16 MiB: then 1M x QD32 only)
  fio-best       the same two configs overwriting the existing checkpoint
                 file's laid-out blocks
  one-tensor     nvio.save({"x": ONE uint8 tensor of the state's bytes}): the
                 control (what the device takes from nvio itself), new file
  nvio.save      nvio.save(sd, p), new file
  nvio.save(spare)  nvio.save(sd, p, spare=True)
  st.save_file   nvio.safetensors.save_file(flat sd, p), new file
  st.save_file(spare)  the same with spare=True
  nvio.dcp       torch.distributed.checkpoint.save(sd, storage_writer=
                 nvio.dcp.FileSystemWriter(d)) in one process, into a
                 directory removed first (untimed): new files
  nvio.dcp.save  nvio.dcp.save(sd, checkpoint_id=d): the same writer through
                 nvio's wrapper, which pauses the cyclic collector for the
                 call (DCP's planning of thousands of items can start a full
                 collection, 0.12 s here). This bench collects before every
                 timed save, which leaves DCP's planning no collection to
                 start in either row; bench/save_ab.py's dcp,dcp-wrapper
                 variants measure the difference without that
  async.return   nvio's AsyncCheckpointer(pool reused across rounds).save:
                 until the call returns; async.total: until its future
                 resolves (the file durable); one run gives both
  memcpy         one copy of every storage into the async pool's buffer
                 (idle between saves, pre-faulted): what async.return is held
                 to (issue 33: <= 1 memcpy of the state)
  torch.save     torch.save(sd, p) + fsync of p (anchor)
  DCP            dcp.save with torch's own FileSystemWriter(d,
                 thread_count=--dcp-threads, sync_files=True), into a fresh
                 directory (anchor)

Every single-file writer writes the same path p (its spare .p.nvio-spare
kept by the spare rows: two spare saves in the validation make it, so every
timed spare save overwrites blocks written before); fio-best overwrites p
too. The order in a round is fio-best, the spare rows (a spare save frees no
blocks: see checkpoint_bench.py's docstring on the real disk's discards),
then the new-file rows; rotation keeps the cyclic order.

Load rows (page cache dropped; of nvio.save's file): torch.load, nvio.load,
fio-best read (the same two configs, reading p).

GB/s = the state's tensor bytes / seconds (nvio's files also hold pickles,
zip records and 4 KiB padding: tiny50000's file is ~2x its tensor bytes);
fio's = its own bytes / its seconds. Ratios: the median of per-round ratios,
with their min-max. CPU s/GB: user+system of this process (every thread);
fio's from its own figures.

Where the time goes (the breakdown tables): after the rounds, one more
nvio.save (new), nvio.save(spare) and async_save call (the pool warmed by
one save first) per state and disk, with timers put
around nvio's internal functions IN THIS PROCESS (monkeypatched, found by
name in whatever nvio module holds them; nvio has no timing hook of its
own): pickling, planning, opening the temporary, fallocate, waits for the
CRC/copy threads, I/O submission, I/O waits, synchronous writes, commit,
and the release of the replaced file; times are exclusive (a nested timer's
time is not counted again in its caller) and measured on the calling thread
only; the rest of the wall time is "other". With strace present, a third
save runs with `strace -f -T` attached, for the commit's split into fsync,
link/rename and directory fsync (strace slows that save: only its
syscall durations are used). These saves are not among the rounds'.

Needs root (drop_caches, hugetlbfs, loop devices). Memory at --scale 1:
the state + the control + the async pool (~7 GB) + the RAM disks' live
files (up to ~3 checkpoints on one of them at a time).

    # reduced matrix (~10 min on a quiet 2-core VM):
    python3 bench/save_bench.py --scale 0.1 --rounds 3 --out bench/results/save-DATE-reduced.md
    # full matrix:
    python3 bench/save_bench.py --rounds 5 --out bench/results/save-DATE.md
    # this helper's smoke test (tiny, 1 round, one disk):
    python3 bench/save_bench.py --scale small --rounds 1 --disk ram-ext4
"""
import argparse
import collections
import concurrent.futures
import contextlib
import datetime
import functools
import gc
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import checkpoint_bench as cb  # noqa: E402
import core_bench  # noqa: E402
import ramdisk  # noqa: E402
import vec_sizes  # noqa: E402

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

try:
    import nvio
except ImportError:
    sys.path.insert(0, os.path.join(REPO, "python"))
    import nvio
import nvio.dcp  # noqa: E402
import nvio.safetensors  # noqa: E402
from nvio.checkpoint import AsyncCheckpointer  # noqa: E402

MiB = 1 << 20
warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
log = cb.log

# --- states --------------------------------------------------------------------

STATES = ("llama22", "small5000", "mixed", "tiny50000")
DISKS = ("real", "ram-ext4", "ram-xfs")


def _rnd(shape, std, g, dtype=torch.float32):
    t = torch.empty(shape, dtype=torch.float32).uniform_(-std, std, generator=g)
    return t if dtype == torch.float32 else t.to(dtype)


def llama22(scale):
    g = torch.Generator().manual_seed(22)

    def rows(n):
        return max(1, int(round(n * scale)))
    sd = {"model.embed_tokens.weight": _rnd((rows(32000), 1408), 0.02, g)}
    for i in range(10):
        sd["model.layers.%d.self_attn.qkvo.weight" % i] = _rnd((rows(4096), 4096), 0.02, g)
        sd["model.layers.%d.mlp.up_proj.weight" % i] = _rnd((rows(7168), 4096), 0.02, g)
    sd["lm_head.weight"] = _rnd((rows(32000), 1408), 0.02, g)
    return sd


def small5000(scale):
    return cb.small_tensors(5000, int((2 << 30) * scale))


def mixed(scale):
    layers = max(1, int(round(12 * scale)))
    vocab = 32000 if scale >= 0.5 else max(1000, int(32000 * scale))
    shapes, _ = vec_sizes.state_dict(hidden=1024, layers=layers, heads=16, kv_heads=4,
                                     inter=2816, vocab=vocab, dtype_bytes=2)
    g = torch.Generator().manual_seed(3)
    model = {n: _rnd(s, 0.02, g, torch.bfloat16) for n, s in shapes}
    for i in range(layers):     # int64 buffers, as MoE routers' counters are
        model["model.layers.%d.router.tokens_per_expert" % i] = torch.randint(
            0, 1 << 40, (64,), generator=g, dtype=torch.int64)
    state = {i: {"step": torch.tensor(1000.0), "exp_avg": _rnd(s, 1e-3, g),
                 "exp_avg_sq": _rnd(s, 1e-6, g).abs_()} for i, (n, s) in enumerate(shapes)}
    groups = [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
               "amsgrad": False, "foreach": None, "maximize": False, "capturable": False,
               "differentiable": False, "fused": None, "decoupled_weight_decay": True,
               "params": list(range(len(shapes)))}]
    n = max(1024, int(24_000_000 * scale))
    sampler = {"indices": torch.randperm(n, generator=g, dtype=torch.int64),
               "consumed": torch.tensor(123456789, dtype=torch.int64), "epoch": 3}
    return {"model": model, "optimizer": {"state": state, "param_groups": groups},
            "sampler": sampler}


def tiny50000(scale, count=50000):
    g = torch.Generator().manual_seed(50)
    top = max(2, int(1024 * scale))
    sizes = torch.randint(1, top + 1, (count,), generator=g).tolist()
    return {"t.%d" % i: torch.empty(k).uniform_(-1, 1, generator=g)
            for i, k in enumerate(sizes)}


MAKERS = {"llama22": llama22, "small5000": small5000, "mixed": mixed,
          "tiny50000": tiny50000}


def flat_named(sd):
    """{name: tensor} of a nested state, for safetensors (names as
    checkpoint_bench.flat makes them, the leading '/' dropped)."""
    return {k.lstrip("/"): t.contiguous() for k, t in cb.flat(sd)}


def zeros_like_state(o):
    if isinstance(o, torch.Tensor):
        return torch.zeros_like(o)
    if isinstance(o, dict):
        return {k: zeros_like_state(v) for k, v in o.items()}
    if isinstance(o, list):
        return [zeros_like_state(v) for v in o]
    if isinstance(o, tuple):
        return tuple(zeros_like_state(v) for v in o)
    return o


# --- the breakdown: timers around nvio's internals (this process only) ---------

class Hooks:
    """Exclusive wall time of labelled nvio internals on the calling thread,
    by monkeypatching (see the module's docstring). ``with hooks.on():``
    installs them, the block's end takes them all off again."""

    # (attribute name, label): functions replaced in every nvio module that
    # holds them (a module's `from x import f` copy too)
    FUNCS = [("write_plan", "writer's Python"), ("write_packed", "writer's Python"),
             ("write_plans", "writer's Python"),
             # the packed windows: copy+CRC in C (its I/O waits are nested)
             ("write_image", "copy+CRC wait"),
             ("_snapshot", "copies (snapshot)"),
             ("hold_replaced", "hold/release replaced"),
             ("release_replaced", "hold/release replaced"),
             ("reserve_space", "fallocate"),
             ("write_device", "I/O submit")]

    def __init__(self):
        self.t = collections.defaultdict(float)
        self.n = collections.defaultdict(int)
        self.stack = []
        self.main = threading.get_ident()
        self.found = set()

    def wrap(self, label, fn):
        hooks = self

        @functools.wraps(fn)
        def timed(*a, **k):
            if threading.get_ident() != hooks.main:
                return fn(*a, **k)
            fr = [label, time.perf_counter(), 0.0]
            hooks.stack.append(fr)
            try:
                return fn(*a, **k)
            finally:
                dt = time.perf_counter() - fr[1]
                hooks.stack.pop()
                hooks.t[label] += dt - fr[2]
                hooks.n[label] += 1
                if hooks.stack:
                    hooks.stack[-1][2] += dt
        return timed

    def reset(self):
        self.t.clear()
        self.n.clear()

    @contextlib.contextmanager
    def on(self):
        undo = []

        def setattr_(obj, name, new):
            undo.append((obj, name, obj.__dict__.get(name, _MISSING)))
            setattr(obj, name, new)

        mods = [m for n, m in list(sys.modules.items())
                if m is not None and (n == "nvio" or n.startswith("nvio."))]
        hooks = self
        # crc_submit: its result() is the wait for the CRC threads
        orig_crc = None
        for m in mods:
            f = m.__dict__.get("crc_submit")
            if callable(f):
                orig_crc = orig_crc or f
        if orig_crc is not None:
            self.found.add("crc_submit")

            @functools.wraps(orig_crc)
            def crc_submit(regions, *a, **k):
                res = orig_crc(regions, *a, **k)
                w = hooks.wrap("CRC wait", res)
                for attr in ("settle",):
                    if hasattr(res, attr):
                        setattr(w, attr, getattr(res, attr))
                return w
            for m in mods:
                if m.__dict__.get("crc_submit") is orig_crc:
                    setattr_(m, "crc_submit", crc_submit)
        for name, label in self.FUNCS:
            origs = {}
            for m in mods:
                f = m.__dict__.get(name)
                if callable(f) and not isinstance(f, type):
                    w = origs.setdefault(id(f), self.wrap(label, f))
                    setattr_(m, name, w)
                    self.found.add(name)
        # classes, patched once each wherever they live
        seen = set()
        for m in mods:
            # a streamed save's windows (ImageStream._pump: copy+CRC, its
            # I/O waits nested) and allocations run inside the pickling
            for cname, meth, label in (("Plan", "__init__", "planning"),
                                       ("_Pickler", "dump", "pickling"),
                                       ("ImageStream", "_pump", "copy+CRC wait"),
                                       ("ImageStream", "_allocate", "fallocate"),
                                       # nvio.dcp's writer: what DCP calls it for
                                       ("FileSystemWriter", "write_data", "writer's Python"),
                                       ("FileSystemWriter", "finish", "DCP metadata")):
                c = m.__dict__.get(cname)
                if isinstance(c, type) and (id(c), meth) not in seen and hasattr(c, meth):
                    seen.add((id(c), meth))
                    setattr_(c, meth, self.wrap(label, getattr(c, meth)))
                    self.found.add("%s.%s" % (cname, meth))
        from nvio import _futures, handles
        fut = _futures.NvioFuture
        setattr_(fut, "result", self.wrap("I/O wait",
                                          fut.__dict__.get("result",
                                                           concurrent.futures.Future.result)))
        self.found.add("NvioFuture.result")
        fcls = handles.AioHandle.__dict__.get("_file_class", _futures.File)
        body = {}
        for meth, label in (("pwritev", "sync writes"), ("pwrite", "sync writes"),
                            ("pwritev_async", "I/O submit"), ("pwrite_async", "I/O submit"),
                            ("allocate", "fallocate"), ("commit", "commit"),
                            ("close", "close")):
            if hasattr(fcls, meth):
                body[meth] = self.wrap(label, getattr(fcls, meth))
        body["__slots__"] = ()
        timed_file = type("TimedFile", (fcls,), body)
        setattr_(handles.AioHandle, "_file_class", timed_file)
        self.found.add("File methods")
        hopen = handles.AioHandle.open
        setattr_(handles.AioHandle, "open", self.wrap("open", hopen))
        try:
            yield self
        finally:
            for obj, name, old in reversed(undo):
                if old is _MISSING:
                    delattr(obj, name)
                else:
                    setattr(obj, name, old)


_MISSING = object()

BREAK_COLS = ["pickling", "planning", "copies (snapshot)", "writer's Python", "open",
              "fallocate",
              "copy+CRC wait", "CRC wait",
              "I/O submit", "I/O wait", "sync writes", "commit", "close",
              "hold/release replaced", "DCP metadata"]


@contextlib.contextmanager
def straced(pid, out):
    """strace -f -T of this process for the block (fsync, link, rename:
    the commit's split); the log in ``out``."""
    p = subprocess.Popen(["strace", "-f", "-T", "-qq", "-o", out, "-e",
                          "trace=fsync,fdatasync,linkat,renameat2,rename,renameat",
                          "-p", str(pid)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    # attached once the threads show up as traced
    t0 = time.time()
    while time.time() - t0 < 10:
        with open("/proc/%d/status" % pid) as f:
            if re.search(r"TracerPid:\s+%d\b" % p.pid, f.read()):
                break
        time.sleep(0.02)
    time.sleep(0.2)
    try:
        yield
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def strace_split(path):
    """{"fsync": s, "fsync dir": s, "link/rename": s} from strace -T's log."""
    out = collections.defaultdict(float)
    fsyncs = []
    with open(path) as f:
        for line in f:
            # "fsync(5) = 0 <0.0012>", or split across threads: "fsync(5
            # <unfinished ...>" then "<... fsync resumed>) = 0 <0.0012>"
            m = re.search(r"(?:<\.\.\. (\w+) resumed>|(\w+)\(.*\)).*=\s+-?\d+.*<([\d.]+)>$",
                          line.rstrip())
            if not m:
                continue
            call, secs = m.group(1) or m.group(2), float(m.group(3))
            if call in ("fsync", "fdatasync"):
                fsyncs.append(secs)
            else:
                out["link/rename"] += secs
    # commit: the file's fsync first, the directory's last (src/file.c)
    if fsyncs:
        out["fsync"] += fsyncs[0]
        out["fsync dir"] += sum(fsyncs[1:])
    return dict(out)


# --- one state on one disk ------------------------------------------------------

class Cell:
    def __init__(self, a, disk, d, name, sd, fio):
        self.a, self.disk, self.dir, self.name, self.sd, self.fio = a, disk, d, name, sd, fio
        self.p = os.path.join(d, "nvio-savebench.pt")
        self.spare = os.path.join(d, ".nvio-savebench.pt.nvio-spare")
        self.pnew = os.path.join(d, "nvio-savebench-fio-new.bin")
        self.dnvio = os.path.join(d, "nvio-savebench-dcp-nvio")
        self.ddcp = os.path.join(d, "nvio-savebench-dcp-torch")
        self.st = cb.storages(sd)
        self.nbytes = sum(s.nbytes() for s in self.st)
        self.ntensors = sum(1 for _ in cb.flat(sd))
        self.flat = flat_named(sd)
        self.checks = []
        self.pairs = 0
        self.ckpt = self.copybuf = self.one = None
        self.breakdown = {}
        if self.nbytes >= 16 * MiB:
            self.fio_bytes, self.fio_cfgs = self.nbytes // (16 * MiB) * (16 * MiB), cb.FIO_CFGS
        else:
            self.fio_bytes = max(MiB, self.nbytes // MiB * MiB)
            self.fio_cfgs = cb.FIO_CFGS[:1]

    def paths(self):
        return [self.p, self.spare, self.pnew]

    def cleanup(self):
        for x in self.paths():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(x)
        for d in (self.dnvio, self.ddcp):
            shutil.rmtree(d, ignore_errors=True)
        if self.disk != "real":
            cb.fstrim(self.dir)

    def _after(self):
        gc.collect()
        if self.disk != "real":
            cb.fstrim(self.dir)

    def timed(self, fn, before=None):
        if before is not None:
            before()                      # untimed preparation
        core_bench.drop_caches()
        c0, t0 = cb.cpu_self(), time.perf_counter()
        out = fn()
        secs, cpu = time.perf_counter() - t0, cb.cpu_self() - c0
        del out
        self._after()
        return dict(gbps=self.nbytes / secs / 1e9, secs=secs, cpu=cpu / (self.nbytes / 1e9))

    # -- writers (each also used once by the validation)
    def nvio_save(self):
        nvio.save(self.sd, self.p)

    def nvio_spare(self):
        nvio.save(self.sd, self.p, spare=True)

    def one_tensor(self):
        nvio.save({"x": self.one}, self.p)

    def st_new(self):
        nvio.safetensors.save_file(self.flat, self.p)

    def st_spare(self):
        nvio.safetensors.save_file(self.flat, self.p, spare=True)

    def rm_dir(self, d):
        return lambda: shutil.rmtree(d, ignore_errors=True)

    def nvio_dcp(self):
        dcp.save(self.sd, storage_writer=nvio.dcp.FileSystemWriter(self.dnvio))

    def nvio_dcp_save(self):
        nvio.dcp.save(self.sd, checkpoint_id=self.dnvio)

    def torch_dcp(self):
        dcp.save(self.sd, storage_writer=dcp.FileSystemWriter(
            self.ddcp, thread_count=self.a.dcp_threads, sync_files=True))

    def torch_save(self):
        torch.save(self.sd, self.p)
        cb.fsync_path(self.p)

    def async_run(self):
        core_bench.drop_caches()
        c0, t0 = cb.cpu_self(), time.perf_counter()
        fut = self.ckpt.save(self.sd, self.p)
        t1, c1 = time.perf_counter(), cb.cpu_self()
        fut.result()
        t2, c2 = time.perf_counter(), cb.cpu_self()
        self._after()
        g = self.nbytes / 1e9
        return (dict(gbps=g / (t1 - t0), secs=t1 - t0, cpu=(c1 - c0) / g),
                dict(gbps=g / (t2 - t0), secs=t2 - t0, cpu=(c2 - c0) / g))

    def memcpy(self):
        dst, off = self.copybuf, 0
        for s in self.st:
            n = s.nbytes()
            dst[off:off + n].copy_(torch.empty(0, dtype=torch.uint8).set_(s, 0, (n,), (1,)))
            off += n

    def fio_run(self, op, new=False, target=None):
        best = None
        target = target or (self.pnew if new else self.p)
        for c in self.fio_cfgs:
            if new:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(target)
                self._after()
            r = self.fio.run_fio(op, target, self.fio_bytes, c)
            if best is None or r["gbps"] > best["gbps"]:
                best = r
        if new:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)
            self._after()
        return dict(gbps=best["gbps"], secs=best["secs"], cpu=best["cpu"])

    def spare_pair(self, save):
        """A spare save and fio overwriting THE SAME BLOCKS, back to back, in
        turn first: fio writes the spare before the save writes it, or the
        checkpoint the save has just swapped in. The spare and the
        checkpoint are two files whose speed differs on this disk by up to
        1.4x (measured: 7.0 against 4.9 GB/s, the same pattern, every round),
        so fio-best, which rewrites whatever file is at the checkpoint's
        path, can be the other one. Returns (fio, save)."""
        self.pairs += 1
        if self.pairs % 2:
            f = self.fio_run("write", target=self.spare)
            return f, self.timed(save)
        r = self.timed(save)
        return self.fio_run("write", target=self.p), r

    # -- validation (untimed): every writer once, its file read back
    def check(self, what, ok, msg):
        self.checks.append("%s: %s" % (what, msg))
        log("validate %s %s %s: %s" % (self.disk, self.name, what, msg))
        if not ok:
            raise RuntimeError("validation failed: %s %s" % (what, msg))

    def validate(self, full):
        """Every writer once, its file read back (``full``: the first disk of
        a state; the files' bytes do not depend on the disk, so on the others
        only the spare is made and nvio.save's file read back)."""
        from safetensors.torch import load_file
        self.nvio_save()
        a, b = cb.same(torch.load(self.p), self.sd) if full else True, \
            cb.same(nvio.load(self.p), self.sd)
        self.check("nvio.save", a and b, "%snvio.load %s" % (
            ("torch.load %s, " % ("equal" if a else "DIFFERENT")) if full else "",
            "equal" if b else "DIFFERENT"))
        self.nvio_spare()           # makes the spare
        self.nvio_spare()           # writes into it
        b = cb.same(nvio.load(self.p), self.sd) if full else True
        self.check("nvio.save(spare) x2", b and os.path.exists(self.spare),
                   "%sspare %s" % (("nvio.load %s, " % ("equal" if b else "DIFFERENT"))
                                   if full else "",
                                   "there" if os.path.exists(self.spare) else "MISSING"))
        self.ckpt.save(self.sd, self.p).result()      # also makes the async pool's buffer
        if not full:
            return
        ok = cb.same(torch.load(self.p), self.sd)
        self.check("async_save", ok, "torch.load %s" % ("equal" if ok else "DIFFERENT"))
        for what, w in (("st.save_file", self.st_new), ("st.save_file(spare)", self.st_spare)):
            w()
            got = load_file(self.p)
            ok = got.keys() == self.flat.keys() and all(
                torch.equal(got[k], v) for k, v in self.flat.items())
            self.check(what, ok, "safetensors.load_file %s" % ("equal" if ok else "DIFFERENT"))
            del got
        self.nvio_spare()       # the spare is a checkpoint again (untimed)
        self.rm_dir(self.dnvio)()
        self.nvio_dcp()
        tmpl = zeros_like_state(self.sd)
        dcp.load(tmpl, storage_reader=nvio.dcp.FileSystemReader(self.dnvio))
        ok = cb.same(tmpl, self.sd)
        del tmpl
        self.check("nvio.dcp", ok, "dcp.load (nvio's reader) %s" % (
            "equal" if ok else "DIFFERENT"))
        self.rm_dir(self.dnvio)()
        self.nvio_dcp_save()
        tmpl = zeros_like_state(self.sd)
        nvio.dcp.load(tmpl, checkpoint_id=self.dnvio)
        ok = cb.same(tmpl, self.sd)
        del tmpl
        self.check("nvio.dcp.save", ok, "nvio.dcp.load %s" % ("equal" if ok else "DIFFERENT"))
        self.rm_dir(self.dnvio)()
        gc.collect()

    def setup(self, full_check):
        self.ckpt = AsyncCheckpointer()
        self.validate(full_check)
        # the control: ONE tensor of the state's bytes (the same bytes)
        self.one = torch.empty(self.nbytes, dtype=torch.uint8)
        off = 0
        for s in self.st:
            n = s.nbytes()
            self.one[off:off + n].copy_(torch.empty(0, dtype=torch.uint8).set_(s, 0, (n,), (1,)))
            off += n
        self.one_tensor()
        ok = torch.equal(nvio.load(self.p)["x"], self.one)
        self.check("one-tensor", ok, "nvio.load %s" % ("equal" if ok else "DIFFERENT"))
        self.nvio_save()
        self.copybuf = torch.frombuffer(self.ckpt._free[0], dtype=torch.uint8)
        self.fsize = os.path.getsize(self.p)
        self._after()

    # -- rounds
    def run_saves(self):
        conts = [("fio-best", lambda: self.fio_run("write")),
                 ("spare", lambda: self.spare_pair(self.nvio_spare)),
                 ("st.spare", lambda: self.spare_pair(self.st_spare)),
                 ("fio-new", lambda: self.fio_run("write", new=True)),
                 ("nvio.save", lambda: self.timed(self.nvio_save)),
                 ("one-tensor", lambda: self.timed(self.one_tensor)),
                 ("st.save_file", lambda: self.timed(self.st_new)),
                 ("async", self.async_run),
                 ("memcpy", lambda: self.timed(self.memcpy)),
                 ("nvio.dcp", lambda: self.timed(self.nvio_dcp, self.rm_dir(self.dnvio))),
                 ("nvio.dcp.save", lambda: self.timed(self.nvio_dcp_save,
                                                      self.rm_dir(self.dnvio))),
                 ("torch.save", lambda: self.timed(self.torch_save)),
                 ("DCP", lambda: self.timed(self.torch_dcp, self.rm_dir(self.ddcp)))]
        named = {"spare": "nvio.save(spare)", "st.spare": "st.save_file(spare)"}
        conts = [c for c in conts if named.get(c[0], c[0]) not in self.a.skip]
        per = rounds(self.a.rounds, conts, "%s %s save" % (self.disk, self.name))
        if "async" in per:
            per["async.return"] = [x[0] for x in per["async"]]
            per["async.total"] = [x[1] for x in per.pop("async")]
        for key, row, fio in (("spare", "nvio.save(spare)", "fio-spare"),
                              ("st.spare", "st.save_file(spare)", "fio-spare(st)")):
            if key in per:
                pairs = per.pop(key)
                per[row] = [x[1] for x in pairs]
                per[fio] = [x[0] for x in pairs]
        for d in (self.dnvio, self.ddcp):
            shutil.rmtree(d, ignore_errors=True)
        self.ckpt.close()
        self.ckpt = self.copybuf = self.one = None
        self._after()
        return per

    def run_loads(self):
        self.nvio_save()                   # the file every load reads
        self.fsize = os.path.getsize(self.p)
        conts = [("torch.load", lambda: self.timed(lambda: torch.load(self.p))),
                 ("nvio.load", lambda: self.timed(lambda: nvio.load(self.p))),
                 ("fio-best read", lambda: self.fio_run("read"))]
        return rounds(self.a.rounds, conts, "%s %s load" % (self.disk, self.name))

    def run_breakdown(self):
        """One nvio.save and one nvio.save(spare) under the timers, and (with
        strace) one of each under strace for the commit's split."""
        hooks = Hooks()
        out = {}
        for what, fn in (("nvio.save", self.nvio_save), ("nvio.save(spare)", self.nvio_spare),
                         ("nvio.dcp", self.nvio_dcp)):
            if what == "nvio.dcp":
                self.rm_dir(self.dnvio)()      # a fresh directory, as in the rounds
            core_bench.drop_caches()
            hooks.reset()
            with hooks.on():
                c0, t0 = cb.cpu_self(), time.perf_counter()
                fn()
                wall, cpu = time.perf_counter() - t0, cb.cpu_self() - c0
            row = dict(hooks.t)
            row["_wall"], row["_cpu"] = wall, cpu
            row["_calls"] = dict(hooks.n)
            self._after()
            if self.a.strace and shutil.which("strace") and what != "nvio.dcp":
                core_bench.drop_caches()
                logp = "/tmp/nvio-savebench-strace-%d.log" % os.getpid()
                with straced(os.getpid(), logp):
                    t0 = time.perf_counter()
                    fn()
                    row["_strace_wall"] = time.perf_counter() - t0
                row["_strace"] = strace_split(logp)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(logp)
                self._after()
            out[what] = row
        # async_save's call (what async.return measures): a warm pool first
        ckpt = AsyncCheckpointer()
        try:
            ckpt.save(self.sd, self.p).result()
            self._after()
            core_bench.drop_caches()
            hooks.reset()
            with hooks.on():
                c0, t0 = cb.cpu_self(), time.perf_counter()
                fut = ckpt.save(self.sd, self.p)
                wall, cpu = time.perf_counter() - t0, cb.cpu_self() - c0
            fut.result()
            row = dict(hooks.t)
            row["_wall"], row["_cpu"], row["_calls"] = wall, cpu, dict(hooks.n)
            out["async_save (call)"] = row
        finally:
            ckpt.close()
            del ckpt
            self._after()
        out["_found"] = sorted(hooks.found)
        return out


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


# --- report --------------------------------------------------------------------

def ratio(per, x, y):
    """Per-round ratios of x's GB/s to y's: (median, min, max); None when
    either row was skipped."""
    if x not in per or y not in per:
        return None
    r = [a["gbps"] / b["gbps"] for a, b in zip(per[x], per[y])]
    return statistics.median(r), min(r), max(r)


def fmt_r(t, bold=False):
    if t is None:
        return "—"
    m = ("**%s**" if bold else "%s") % fg(t[0])
    return "%s (%s–%s)" % (m, fg(t[1]), fg(t[2])) if t[1] != t[2] else m


def fg(x):
    """GB/s: two decimals, or two significant digits below 0.1."""
    return "%.2f" % x if x >= 0.1 else "%.2g" % x


def detail_table(per, title, refs):
    med = statistics.median
    out = ["**%s**" % title, "",
           "| row | GB/s median | min–max | s median | CPU s/GB | %s | per-round GB/s |"
           % " | ".join("× " + r for r in refs),
           "|---|---:|---:|---:|---:|%s---|" % ("---:|" * len(refs))]
    for n, v in per.items():
        g = [x["gbps"] for x in v]
        out.append("| %s | %s | %s–%s | %.3f | %.3f | %s | %s |" % (
            n, fg(med(g)), fg(min(g)), fg(max(g)), med([x["secs"] for x in v]),
            med([x["cpu"] for x in v]),
            " | ".join(fmt_r(ratio(per, n, r)) for r in refs),
            " ".join(fg(x) for x in g)))
    return out + [""]


def breakdown_table(res):
    out = ["## Where the time goes (nvio.save, nvio.save(spare), async_save's call, the "
           "nvio.dcp writer; one each, timers in the bench process)", "",
           "Seconds on the calling thread, exclusive, from timers the bench puts around "
           "nvio's internal functions by monkeypatching (nvio has no timing hook): "
           "**measured from outside, approximate**. *copy+CRC wait*: a packed save's "
           "windows copied and checksummed (write_image, or ImageStream._pump for a "
           "save streamed while it pickles, timed apart from the pickling it interrupts: "
           "the caller and the CRC threads in C, its I/O waits apart); *CRC wait*: the "
           "caller waiting for the CRC "
           "threads; "
           "*I/O wait*: waiting on write futures; *sync writes*: blocking pwrite(v) calls; "
           "*commit*: fsync + link/rename + directory fsync (split by `strace -T` from a "
           "second save where strace was present); *copies (snapshot)*: async_save's copy of "
           "the state into its pool (its call returns after it; the write behind it is not "
           "in its row); *other*: the rest of the wall time "
           "(Python between the timed calls). nvio.dcp's row: *writer's Python* is "
           "FileSystemWriter.write_data less what is timed inside it (resolving the items, "
           "laying out and adding each image, the streamed windows' bookkeeping), *DCP "
           "metadata* its finish() (.metadata pickled and committed, old files removed), "
           "*other* mostly DCP's own planning, which runs before the writer is called. "
           "CPU: user+system of every thread of the process during the save.", "",
           "| disk | state | save | wall s | CPU s | %s | other | commit split (strace) |"
           % " | ".join(BREAK_COLS),
           "|---|---|---|---:|---:|%s---:|---|" % ("---:|" * len(BREAK_COLS))]
    found = set()
    for c in res:
        bd = c["breakdown"]
        found.update(bd.get("_found", []))
        for what in BREAK_ROWS:
            row = bd.get(what)
            if not row:
                continue
            cols = [row.get(k, 0.0) for k in BREAK_COLS]
            other = row["_wall"] - sum(v for k, v in row.items() if not k.startswith("_"))
            st = row.get("_strace")
            split = ", ".join("%s %.4f" % (k, v) for k, v in sorted(st.items())) + \
                " (of a %.2f s save under strace)" % row["_strace_wall"] if st else "—"
            out.append("| %s | %s | %s | %.3f | %.2f | %s | %.3f | %s |" % (
                c["disk"], c["state"], what, row["_wall"], row["_cpu"],
                " | ".join("%.3f" % v if v else "·" for v in cols), other, split))
    extra = sorted(set(k for c in res for w in BREAK_ROWS
                       for k in c["breakdown"].get(w, {}) if not k.startswith("_")) -
                   set(BREAK_COLS))
    out += ["", "- hooks found: %s%s" % (", ".join(sorted(found)),
                                         "; other labels: " + ", ".join(extra) if extra else ""),
            ""]
    return out


BREAK_ROWS = ("nvio.save", "nvio.save(spare)", "async_save (call)", "nvio.dcp")

SUMMARY = [("nvio.save", "fio-new"), ("one-tensor", "fio-new"),
           ("nvio.save(spare)", "fio-best"), ("nvio.save(spare)", "fio-spare"),
           ("st.save_file", "fio-new"), ("st.save_file(spare)", "fio-best"),
           ("st.save_file(spare)", "fio-spare(st)"), ("nvio.dcp", "fio-new"),
           ("nvio.dcp.save", "fio-new"),
           ("async.total", "fio-new"), ("torch.save", "fio-new"), ("DCP", "fio-new")]


def report(a, res, disk_lines, guest, t_start, load0, final, huge=None):
    now = datetime.datetime.now(datetime.timezone.utc)
    cpu = core_bench.sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    dirty = core_bench.sh("git -C %s status --porcelain -- src include python" % REPO)
    note = guest["note"]
    if "reported_mib" in guest:
        note += "; reported to the host during the run: %d MiB" % guest["reported_mib"]
    la = os.getloadavg()
    out = ["# Saves of every shape against fio-new and fio-best (issue 33) — %s%s"
           % (now.date(), "" if final else " (PARTIAL: run still going)"), "",
           "- date: %s UTC; wall %.0f min" % (now.strftime("%Y-%m-%d %H:%M"),
                                             (time.time() - t_start) / 60),
           "- machine: %s; %d cores (%s), %.1f GiB RAM, kernel %s" % (
               platform.node(), os.cpu_count(), cpu,
               os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30),
               platform.release()),
           "- load average: %.2f at the start, %.2f %.2f %.2f (1/5/15 min) at the end "
           "(above ~0.5: other jobs shared the machine; this run uses ~1 core itself)"
           % ((load0,) + la),
           "- torch %s; Python %s; nvio %s; fio %s" % (
               torch.__version__, platform.python_version(), nvio.__version__,
               core_bench.sh("fio --version")),
           "- nvio commit: %s%s" % (core_bench.sh("git -C %s log -1 --format='%%h %%s'" % REPO)[:90],
                                    " + UNCOMMITTED changes in src/include/python"
                                    if dirty else ""),
           "- command: `%s`" % " ".join(shlex.quote(x) for x in ["python3"] + sys.argv)]
    out += disk_lines
    out += ["- %s (bench/guestmem.py)" % note,
            "- fio's buffers: %s" % ("huge pages (hugetlbfs, bench/hugepages.py)" if huge else
                                     "4 KiB pages: huge pages could NOT be reserved, so "
                                     "fio-best/fio-new are below their usual ceiling"),
            "- %d rounds, rows interleaved and rotated each round; page cache dropped before "
            "every run; every save durable; ratios = median (min–max) of per-round ratios; "
            "GB = 10^9 bytes of tensor data (fio: its own bytes); torch threads %d; "
            "DCP FileSystemWriter thread_count %d" % (a.rounds, a.torch_threads,
                                                      a.dcp_threads),
            "- scale %s; tiny50000 has %d tensors; rows skipped: %s" % (
               a.scale, a.tiny_count, ", ".join(sorted(a.skip)) or "none"), ""]
    out += ["## Targets (issue 33)", "",
            "Each cell: median (min–max) of per-round ratios. New-file rows × fio-new "
            "(target ≥ 0.95 for nvio.save, safetensors, nvio.dcp), spare rows × fio-best "
            "(target ≥ 0.9), async.return × memcpy *time* (target ≤ 1), nvio.load × "
            "fio-best read (target ≥ 0.9). *fio-spare*: fio overwriting the very blocks "
            "the spare save writes, right before or after it in the same round (the "
            "spare and the checkpoint are two files whose write speed differs on this "
            "disk; fio-best rewrites the one at the checkpoint's path); *fio-spare(st)* "
            "the same for safetensors' spare save.", "",
            "| disk | state | %s | async.return / memcpy time | nvio.load × fio-best read "
            "| fio-new / fio-best |" % " | ".join("%s × %s" % x for x in SUMMARY),
            "|---|---|%s---:|---:|---:|" % ("---:|" * len(SUMMARY))]
    body = []
    for c in res:
        s, ld = c["saves"], c["loads"]
        rt = [x["secs"] / y["secs"] for x, y in zip(s.get("async.return", []),
                                                    s.get("memcpy", []))]
        bold = {"nvio.save", "nvio.save(spare)"}
        out.append("| %s | %s | %s | %s | %s | %s |" % (
            c["disk"], c["state"],
            " | ".join(fmt_r(ratio(s, x, y), x in bold and y != "fio-best")
                       for x, y in SUMMARY),
            fmt_r((statistics.median(rt), min(rt), max(rt)) if rt else None),
            fmt_r(ratio(ld, "nvio.load", "fio-best read"), True) if ld else "—",
            fmt_r(ratio(s, "fio-new", "fio-best"))))
        body += ["## %s, %s: %d tensors in %d storages, %d bytes of tensors; nvio's file "
                 "%d bytes; fio moves %d bytes" % (c["disk"], c["state"], c["ntensors"],
                                                   c["nst"], c["nbytes"], c["fsize"],
                                                   c["fio_bytes"]), "",
                 "- this cell took %.0f s (validation, rounds, loads, breakdown)" % c["wall"],
                 "- validation: " + "; ".join(c["checks"]), ""]
        body += detail_table(s, "save (%s, %s)" % (c["disk"], c["state"]),
                             [x for x in ("fio-new", "fio-best", "fio-spare", "torch.save")
                              if x in s])
        if ld:
            body += detail_table(ld, "load (%s, %s)" % (c["disk"], c["state"]),
                                 ["fio-best read", "torch.load"])
    out += [""] + body
    if any(c["breakdown"] for c in res):
        out += breakdown_table(res)
    text = "\n".join(out) + "\n"
    if final:
        print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


# --- main ------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", default="1",
                    help="state size factor (bytes; never the number of tensors); "
                         "'small' = 0.02 (the smoke test)")
    ap.add_argument("--state", default=",".join(STATES),
                    help="comma-separated, of: %s" % ", ".join(STATES))
    ap.add_argument("--disk", default=",".join(DISKS),
                    help="comma-separated, of: %s" % ", ".join(DISKS))
    ap.add_argument("--tiny-count", type=int, default=50000,
                    help="tensors in tiny50000 (the name stays)")
    ap.add_argument("--real-dir", default="/var/tmp/nvio-savebench")
    ap.add_argument("--ram-size", help="each RAM disk's tmpfs (default: ~6 x the "
                                       "largest state + 2 GiB)")
    ap.add_argument("--no-loads", dest="loads", action="store_false")
    ap.add_argument("--no-breakdown", dest="breakdown", action="store_false")
    ap.add_argument("--no-strace", dest="strace", action="store_false",
                    help="no strace-attached save for the commit's split")
    ap.add_argument("--skip", default="",
                    help="save rows left out, comma-separated (e.g. DCP,torch.save to "
                         "shorten a run; 'async' is async.return and async.total; a "
                         "spare row takes its fio-spare row with it); fio-new and "
                         "fio-best always run")
    ap.add_argument("--dcp-threads", type=int, default=1,
                    help="torch's DCP FileSystemWriter thread_count (its default: 1)")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch.set_num_threads (1: see checkpoint_bench.py)")
    ap.add_argument("--out")
    a = ap.parse_args()
    a.scale = 0.02 if a.scale == "small" else float(a.scale)
    a.skip = set(x for x in a.skip.split(",") if x) - {"fio-new", "fio-best"}
    states = [s for s in a.state.split(",") if s]
    disks = [d for d in a.disk.split(",") if d]
    bad = [x for x in states if x not in STATES] + [x for x in disks if x not in DISKS]
    if bad:
        ap.error("unknown state/disk: %s" % ", ".join(bad))
    if os.geteuid() != 0:
        sys.exit("save_bench.py: needs root (drop_caches, hugetlbfs, loop devices)")
    torch.set_num_threads(a.torch_threads)
    signal.signal(signal.SIGTERM, lambda *x: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *x: sys.exit(129))
    ram_size = a.ram_size or "%dM" % (int(2.3e9 * a.scale * 6 / MiB) + 2048)
    t_start, load0 = time.time(), os.getloadavg()[0]
    res = []
    with core_bench.fio_rig(8 * MiB * 128 + 64 * MiB, log) as (fio, guest), \
            contextlib.ExitStack() as stack:
        dirs = []
        for d in disks:
            if d == "real":
                os.makedirs(a.real_dir, exist_ok=True)
                dirs.append((d, a.real_dir))
            else:
                fs = d.split("-")[1]
                dirs.append((d, stack.enter_context(ramdisk.mounted(
                    ram_size, log, fs=fs, name="savebench-%s" % fs))))
        disk_lines = [core_bench.disk_info("real" if k == "real" else "ram", d)
                      .replace("- ram disk", "- %s disk" % k) for k, d in dirs]
        for sname in states:
            log("making %s (scale %s)" % (sname, a.scale))
            sd = tiny50000(a.scale, a.tiny_count) if sname == "tiny50000" else \
                MAKERS[sname](a.scale)
            for disk, d in dirs:
                cell = Cell(a, disk, d, sname, sd, fio)
                t_cell = time.time()
                try:
                    cell.setup(disk == dirs[0][0])
                    saves = cell.run_saves()
                    loads = cell.run_loads() if a.loads else None
                    bd = cell.run_breakdown() if a.breakdown else {}
                finally:
                    cell.cleanup()
                res.append(dict(disk=disk, state=sname, nbytes=cell.nbytes,
                                nst=len(cell.st), ntensors=cell.ntensors, fsize=cell.fsize,
                                fio_bytes=cell.fio_bytes, checks=cell.checks, saves=saves,
                                loads=loads, breakdown=bd, wall=time.time() - t_cell))
                report(a, res, disk_lines, guest, t_start, load0, final=False,
                       huge=fio.huge_path)
                done, total = len(res), len(states) * len(dirs)
                log("cell %d/%d (%s, %s) took %.0f s; %.1f min so far%s" % (
                    done, total, disk, sname, res[-1]["wall"], (time.time() - t_start) / 60,
                    "" if done == total else "; the rest ~%.0f min if cells cost alike" % (
                        (time.time() - t_start) / done * (total - done) / 60)))
                del cell
                gc.collect()
            del sd
            gc.collect()
        huge = fio.huge_path
    report(a, res, disk_lines, guest, t_start, load0, final=True, huge=huge)


if __name__ == "__main__":
    main()
