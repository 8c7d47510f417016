#!/usr/bin/env python3
"""bench/torch_save.py - torch.save / torch.load through nvio.open against
the same calls on a path, and against fio-best on the same bytes, in
interleaved rounds (../shared/BENCHMARKING.md rule 7).

The state dict is bench/vec_sizes.py's Llama-like model (hidden 2048, 22
layers, vocab 32000, bf16: 201 tensors, 2.2 GB), random values, made once.

  save-path     with open(p, "wb") as f: torch.save(sd, f); f.flush(); os.fsync(f)
                (torch.save(sd, p) does not fsync; the same call plus fsync)
  save-nvio     with nvio.open(p, "wb") as f: torch.save(sd, f)
                (atomic: fsync, rename, fsync of the directory at close)
  save-nvio-inplace  nvio.open(p, "wb", atomic=False, fsync=True)
  load-path     torch.load(p)
  load-pyfile   torch.load(open(p, "rb"))
  load-nvio     with nvio.open(p, "rb") as f: torch.load(f)
  fio-best      the better, per round, of libaio 1M x QD32 x 1 job and
                8M x QD128 x 2 jobs, both with huge-page buffers (the RAM and
                real-disk winners of core_bench.py's sweep), O_DIRECT,
                writes --end_fsync=1, on a file of the checkpoint's size
                rounded down to 16 MiB

Page cache dropped before every run; every load is checked against the
state dict (untimed).

    python3 bench/torch_save.py --rounds 5 --out bench/results/x.md
"""
import argparse
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
import guestmem  # noqa: E402
import hugepages  # noqa: E402
import vec_sizes  # noqa: E402

import torch  # noqa: E402

try:
    import nvio
except ImportError:
    sys.path.insert(0, os.path.join(REPO, "python"))
    import nvio

MiB = 1 << 20


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def make_sd():
    tensors, _ = vec_sizes.state_dict()
    g = torch.Generator().manual_seed(0)
    sd = {}
    for name, shape in tensors:
        sd[name] = torch.randn(shape, generator=g, dtype=torch.float32).to(torch.bfloat16)
    return sd


def cpu():
    r = os.times()
    return r.user + r.system


def timed(fn):
    core_bench.drop_caches()
    c0, t0 = cpu(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, cpu() - c0, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/root/nvio-bench")
    ap.add_argument("--out")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    p = os.path.join(a.dir, "nvio-torch.pt")
    pf = os.path.join(a.dir, "nvio-torch-fio.bin")
    log("making the state dict")
    sd = make_sd()
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())

    def save_path():
        with open(p, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())

    def save_nvio():
        with nvio.open(p, "wb") as f:
            torch.save(sd, f)

    def save_nvio_inplace():
        with nvio.open(p, "wb", atomic=False, fsync=True) as f:
            torch.save(sd, f)

    def load_nvio():
        with nvio.open(p, "rb") as f:
            return torch.load(f)

    def load_pyfile():
        with open(p, "rb") as f:
            return torch.load(f)

    saves = [("save-path", save_path), ("save-nvio", save_nvio),
             ("save-nvio-inplace", save_nvio_inplace)]
    loads = [("load-path", lambda: torch.load(p)), ("load-pyfile", load_pyfile),
             ("load-nvio", load_nvio)]
    fio = core_bench.Bench.__new__(core_bench.Bench)
    fio.args = argparse.Namespace(quick=False)
    fio_cfgs = [dict(engine="libaio", block=MiB, qd=32, jobs=1, huge=1),
                dict(engine="libaio", block=8 * MiB, qd=128, jobs=2, huge=1)]
    res = {}
    t_start = time.time()
    import signal
    signal.signal(signal.SIGTERM, lambda *x: sys.exit(143))
    try:
        with guestmem.page_reporting_paused(True) as guest, \
                hugepages.reserved(8 * MiB * 128 + 64 * MiB, log) as fio.huge_path:
            save_path()
            fsize = os.path.getsize(p)
            fbytes = fsize // (16 * MiB) * (16 * MiB)
            fio.log = log
            core_bench.Bench.prepare_file(fio, pf, fbytes)
            log("checkpoint %d bytes (%d of tensors); fio file %d bytes" % (fsize, nbytes, fbytes))
            # validation, once per writer, untimed
            checks = []
            for wn, w in saves:
                w()
                for ln, ld in loads:
                    got = ld()
                    ok = got.keys() == sd.keys() and all(torch.equal(got[k], sd[k]) for k in sd)
                    checks.append("%s then %s: %s" % (wn, ln, "ok" if ok else "WRONG"))
                    del got
                    if not ok:
                        raise RuntimeError(checks[-1])
            for phase, conts, op in (("save", saves, "write"), ("load", loads, "read")):
                def fio_best(op=op):
                    best = None
                    for c in fio_cfgs:
                        r = fio.run_fio(op, pf, fbytes, c)
                        if best is None or r["gbps"] > best["gbps"]:
                            best = r
                    return dict(gbps=best["gbps"], cpu=best["cpu"])

                allc = list(conts) + [("fio-best", fio_best)]
                per = {n: [] for n, _ in allc}
                for r in range(a.rounds):
                    order = allc[r % len(allc):] + allc[:r % len(allc)]
                    for n, fn in order:
                        if n == "fio-best":
                            per[n].append(fn())
                        else:
                            secs, c, out = timed(fn)
                            del out
                            per[n].append(dict(gbps=fsize / secs / 1e9,
                                               cpu=c / (fsize / 1e9), secs=secs))
                    log("%s round %d: %s" % (phase, r + 1, "  ".join(
                        "%s %.2f" % (n, per[n][-1]["gbps"]) for n, _ in allc)))
                res[phase] = per
    finally:
        for x in (p, pf):
            try:
                os.unlink(x)
            except OSError:
                pass

    out = ["# torch.save / torch.load through nvio.open — %s" % datetime.date.today(), "",
           "- date: %s UTC; wall %.0f min" % (datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
                                             (time.time() - t_start) / 60),
           "- machine: %d cores, kernel %s; torch %s; Python %s; nvio %s (%s)" % (
               os.cpu_count(), platform.release(), torch.__version__,
               platform.python_version(), nvio.__version__, os.path.dirname(nvio.__file__)),
           "- nvio commit: %s" % subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h %s"],
                                                 capture_output=True, text=True).stdout.strip(),
           "- dir: %s" % core_bench.disk_info("real", a.dir),
           "- command: `%s`" % " ".join(shlex.quote(x) for x in ["python3"] + sys.argv),
           "- state dict: bench/vec_sizes.py's model, 201 bf16 tensors, %d bytes; checkpoint "
           "file %d bytes; GB/s = checkpoint bytes / seconds (fio: its own bytes)" % (nbytes, fsize),
           "- %s (bench/guestmem.py)" % guest["note"],
           "- %d rounds, interleaved and rotated; page cache dropped before every run; "
           "ratios = median of per-round ratios" % a.rounds, ""]
    out += ["- validation: " + "; ".join(checks), ""]
    for phase, base in (("save", "save-path"), ("load", "load-path")):
        out += core_bench.ratio_table("**%s**" % phase, res[phase], base)
    core_bench.emit(out, a.out)


if __name__ == "__main__":
    main()
