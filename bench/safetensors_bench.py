#!/usr/bin/env python3
"""bench/safetensors_bench.py - loading and saving safetensors models with
nvio.safetensors against the safetensors library, transformers, torch.load
and fio-best on the same bytes, in interleaved rounds (BENCHMARKING.md rule 7).

The model: a Llama made from a config (hidden 2048, intermediate 5632, GQA
32/4 heads, vocab 32000, --layers layers; bf16, random weights, nothing
downloaded), saved with transformers' save_pretrained in --shards shards.

Load contenders (page cache dropped before each; every tensor touched once
afterwards, one byte per page, so lazily mapped pages are really read):
  nvio-dir        nvio.safetensors.load_model_dir(dir): all shards at once
  nvio-files      nvio.safetensors.load_file(shard) for each shard in turn
  st-mmap         safetensors.torch.load_file(shard) (the default mmap backend)
  st-pread        safetensors.torch.load_file(shard, backend="pread") (when offered)
  hf              transformers AutoModelForCausalLM.from_pretrained(dir)
  nvio-hf         nvio.safetensors.from_pretrained(AutoModelForCausalLM, dir)
  torch.load      torch.load of the same state dict saved by torch.save
  fastsafetensors fastsafetensors.fastsafe_open(shards, nogds=True) (its CPU path),
                  every tensor taken (when importable)
  runai           runai_model_streamer.SafetensorsStreamer, every shard streamed to
                  the CPU (when importable)
                  (peers: pip install --no-deps --target DIR fastsafetensors==0.5.0
                  runai-model-streamer==0.17.0 humanize typer; PYTHONPATH=DIR)
  fio-best        the better, per round, of libaio 1M x QD32 x 1 job and
                  8M x QD128 x 2 jobs with huge-page buffers, O_DIRECT, on a
                  file of the shards' total size rounded down to 16 MiB
Save contenders (one file of the whole state dict, ends durable):
  nvio-save       nvio.safetensors.save_file (atomic: temp, fsync, rename, fsync dir)
  nvio-save(spare) the same with spare=True: written into the blocks of the file's
                  spare (an older version kept beside it), swapped in at commit;
                  two untimed spare saves before the rounds make the spare, and
                  the other writers' renames leave it, so every timed spare save
                  overwrites blocks written before
  st-save         safetensors.torch.save_file, then fsync of the file
  fio-best        as above, writing over the laid-out file (--end_fsync=1)
  fio-new         the better fio config writing a NEW file (unlinked first,
                  --fallocate=none): what a save really has to do on ext4

    sudo python3 bench/safetensors_bench.py --rounds 5 --out bench/results/x.md
    sudo python3 bench/safetensors_bench.py --ram --layers 8 ...   # RAM disk
"""
import argparse
import contextlib
import datetime
import filecmp
import gc
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import core_bench  # noqa: E402
import guestmem  # noqa: E402
import hugepages  # noqa: E402
import ramdisk  # noqa: E402

import torch  # noqa: E402

try:
    import nvio
except ImportError:
    sys.path.insert(0, os.path.join(REPO, "python"))
    import nvio
import safetensors  # noqa: E402
import safetensors.torch as st  # noqa: E402
import transformers  # noqa: E402
from nvio import safetensors as nst  # noqa: E402

MiB = 1 << 20


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def make_model(d, layers, shards):
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                   num_hidden_layers=layers, num_attention_heads=32,
                                   num_key_value_heads=4, tie_word_embeddings=False,
                                   torch_dtype="bfloat16")
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        torch.manual_seed(0)
        m = transformers.LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    total = sum(p.numel() * p.element_size() for p in m.state_dict().values())
    m.save_pretrained(d, max_shard_size=max(total // shards + MiB, 16 * MiB))
    del m
    gc.collect()
    return total


def touch(tensors):
    """Read one byte of every page of every tensor (forces mapped pages in)."""
    s = 0
    for t in tensors:
        if t.numel():
            u = t.detach().reshape(-1).view(torch.uint8)
            s += int(u[::4096].sum())
    return s


def shards_of(d):
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".safetensors"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp/nvio-st-bench")
    ap.add_argument("--ram", action="store_true", help="run on a RAM disk (bench/ramdisk.sh)")
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--shards", type=int, default=5)
    ap.add_argument("--skip", default="", help="comma-separated contenders to leave out")
    ap.add_argument("--out")
    a = ap.parse_args()
    ram_env = dict(os.environ, NVIO_RAMDISK="/mnt/nvio-ram-st",
                   NVIO_RAMDISK_BACKING="/mnt/nvio-ram-st-backing")
    ram = contextlib.ExitStack()
    if a.ram:
        # model, one-file save and its spare, fio file (and torch.save's file):
        # ~90 MB a layer + 270 MB each
        model_gib = (a.layers * 90 * MiB + 270 * MiB) / (1 << 30)
        a.dir = os.path.join(ram.enter_context(ramdisk.mounted(
            "%dG" % (int(model_gib * 5) + 1), log, ram_env)), "bench")
    skip = set(x for x in a.skip.split(",") if x)
    os.makedirs(a.dir, exist_ok=True)
    # the run's files go into a directory of its own, removed at the end:
    # --dir itself (and anything else in it) is left alone
    work = tempfile.mkdtemp(prefix="nvio-st-bench-", dir=a.dir)
    disk_line = core_bench.disk_info("ram" if a.ram else "real", work)
    mdir = os.path.join(work, "model")
    ptf = os.path.join(work, "model.pt")
    one = os.path.join(work, "one.safetensors")
    pf = os.path.join(work, "fio.bin")
    t_start = time.time()
    load_start = "%.2f" % os.getloadavg()[0]
    res, checks = {}, []
    try:
        log("making the model")
        shutil.rmtree(mdir, ignore_errors=True)
        nbytes = make_model(mdir, a.layers, a.shards)
        files = shards_of(mdir)
        fsize = sum(os.path.getsize(p) for p in files)
        log("%d shards, %d bytes (%d of tensors)" % (len(files), fsize, nbytes))
        ref = {}
        for p in files:
            ref.update(st.load_file(p))
        if "torch.load" not in skip:
            torch.save(ref, ptf)
        want = sorted(ref)

        def check(name, sd):
            ok = sorted(sd) == want and all(
                (sd[k].dtype == ref[k].dtype and torch.equal(sd[k], ref[k])) for k in want)
            checks.append("%s: %s" % (name, "ok" if ok else "WRONG"))
            if not ok:
                raise RuntimeError(checks[-1])

        def ld_nvio_dir():
            return nst.load_model_dir(mdir)

        def ld_nvio_files():
            sd = {}
            for p in files:
                sd.update(nst.load_file(p))
            return sd

        def ld_st(backend):
            def f():
                sd = {}
                for p in files:
                    sd.update(st.load_file(p, backend=backend))
                return sd
            return f

        def ld_hf():
            m = transformers.AutoModelForCausalLM.from_pretrained(mdir)
            return dict(m.state_dict())

        def ld_nvio_hf():
            m = nst.from_pretrained(transformers.AutoModelForCausalLM, mdir)
            return dict(m.state_dict())

        def ld_torch():
            return torch.load(ptf, weights_only=True)

        loads = [("nvio-dir", ld_nvio_dir), ("nvio-files", ld_nvio_files),
                 ("st-mmap", ld_st("mmap"))]
        try:
            st.load_file(files[0], backend="pread")
            loads.append(("st-pread", ld_st("pread")))
        except TypeError:
            checks.append("safetensors %s has no backend= argument" % safetensors.__version__)
        loads += [("hf", ld_hf), ("nvio-hf", ld_nvio_hf), ("torch.load", ld_torch)]
        try:
            from fastsafetensors import fastsafe_open

            def ld_fast():
                with fastsafe_open(files, nogds=True) as f:
                    return {k: f.get_tensor(k) for k in f.keys()}
            loads.append(("fastsafetensors", ld_fast))
        except ImportError as e:
            checks.append("fastsafetensors not importable (%s)" % e)
        try:
            from runai_model_streamer import SafetensorsStreamer

            def ld_runai():
                sd = {}
                with SafetensorsStreamer() as s:
                    for p in files:
                        s.stream_file(p)
                        for name, t in s.get_tensors():
                            sd[name] = t
                return sd
            loads.append(("runai", ld_runai))
        except ImportError as e:
            checks.append("runai-model-streamer not importable (%s)" % e)
        loads = [x for x in loads if x[0] not in skip]
        for n, fn in loads:
            sd = fn()
            check(n, sd)
            del sd
            gc.collect()
        # no page of the files may stay mapped across the timed cache drops
        del ref
        gc.collect()
        saves_sd = nst.load_model_dir(mdir)

        def sv_nvio():
            nst.save_file(saves_sd, one)

        def sv_nvio_spare():
            nst.save_file(saves_sd, one, spare=True)

        def sv_st():
            st.save_file(saves_sd, one)
            fd = os.open(one, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        saves = [("nvio-save", sv_nvio), ("nvio-save(spare)", sv_nvio_spare), ("st-save", sv_st)]
        sv_nvio_spare()
        sv_nvio_spare()             # the first made the spare, this one wrote into it
        spare = os.path.join(os.path.dirname(one), "." + os.path.basename(one) + ".nvio-spare")
        st.save_file(saves_sd, one + ".ref")
        ok = os.path.exists(spare) and filecmp.cmp(one, one + ".ref", shallow=False)
        os.unlink(one + ".ref")
        checks.append("nvio-save(spare) twice: spare %s, file == st-save file byte for "
                      "byte: %s" % ("there" if os.path.exists(spare) else "MISSING", ok))
        if not ok:
            raise RuntimeError(checks[-1])
        sv_nvio()
        back = nst.load_file(one)
        ok = sorted(back) == want and all(torch.equal(back[k], saves_sd[k]) for k in want)
        checks.append("nvio-save then nvio.load_file: %s" % ("ok" if ok else "WRONG"))
        del back
        if not ok:
            raise RuntimeError(checks[-1])
        st.save_file(saves_sd, one + ".ref")
        same = filecmp.cmp(one, one + ".ref", shallow=False)
        os.unlink(one + ".ref")
        checks.append("nvio-save file == st-save file byte for byte: %s" % same)
        if not same:
            raise RuntimeError(checks[-1])
        ssize = os.path.getsize(one)
        fbytes = fsize // (16 * MiB) * (16 * MiB)

        fio = core_bench.Bench.__new__(core_bench.Bench)
        fio.args = argparse.Namespace(quick=False)
        fio.log = log
        fio_cfgs = [dict(engine="libaio", block=MiB, qd=32, jobs=1, huge=1),
                    dict(engine="libaio", block=8 * MiB, qd=128, jobs=2, huge=1)]
        with guestmem.page_reporting_paused(True) as guest, \
                hugepages.reserved(8 * MiB * 128 + 64 * MiB, log) as fio.huge_path:
            if fio.huge_path is None:
                for c in fio_cfgs:
                    c["huge"] = 0
            core_bench.Bench.prepare_file(fio, pf, fbytes)

            def fio_run(op, c, new=False):
                if new and os.path.exists(pf):
                    os.unlink(pf)
                try:
                    return fio.run_fio(op, pf, fbytes, c)
                except RuntimeError as e:
                    # vm.nr_hugepages is global: another job on this shared
                    # machine setting it back can take our reserved pages
                    if not c.get("huge") or "Bad address" not in str(e):
                        raise
                    checks.append("fio %s %dM x QD%d lost its huge pages once (%s): ran "
                                  "with fio's default buffers" % (
                                      op, c["block"] // MiB, c["qd"], "EFAULT"))
                    if new and os.path.exists(pf):
                        os.unlink(pf)
                    return fio.run_fio(op, pf, fbytes, dict(c, huge=0))

            def fio_best(op):
                best = None
                for c in fio_cfgs:
                    r = fio_run(op, c)
                    if best is None or r["gbps"] > best["gbps"]:
                        best = r
                return dict(gbps=best["gbps"], cpu=best["cpu"])

            def fio_new():
                best = None
                for c in fio_cfgs:
                    r = fio_run("write", c, new=True)
                    if best is None or r["gbps"] > best["gbps"]:
                        best = r
                return dict(gbps=best["gbps"], cpu=best["cpu"])

            def timed(fn, size, load):
                core_bench.drop_caches()
                c0, t0 = core_bench.cpu(), time.perf_counter()
                out = fn()
                if load:
                    touch(out.values())
                secs = time.perf_counter() - t0
                c = core_bench.cpu() - c0
                del out
                gc.collect()
                return dict(gbps=size / secs / 1e9, cpu=c / (size / 1e9), secs=secs)

            for phase, conts, size in (("load", loads, fsize), ("save", saves, ssize)):
                allc = list(conts) + [("fio-best", lambda op=("read" if phase == "load" else
                                                              "write"): fio_best(op))]
                if phase == "save":
                    allc.append(("fio-new", fio_new))
                per = {n: [] for n, _ in allc}
                for r in range(a.rounds):
                    order = allc[r % len(allc):] + allc[:r % len(allc)]
                    for n, fn in order:
                        if n.startswith("fio"):
                            per[n].append(fn())
                        else:
                            per[n].append(timed(fn, size, phase == "load"))
                    log("%s round %d: %s" % (phase, r + 1, "  ".join(
                        "%s %.2f" % (n, per[n][-1]["gbps"]) for n, _ in allc)))
                res[phase] = per
    finally:
        shutil.rmtree(work, ignore_errors=True)
        ram.close()

    disk = "ram" if a.ram else "real"
    out = ["# nvio.safetensors against safetensors, transformers, torch.load, fio-best "
           "(%s disk) — %s" % (disk, datetime.date.today()), "",
           "- date: %s UTC; wall %.0f min" % (datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
                                             (time.time() - t_start) / 60),
           "- machine: %d cores, kernel %s; load average %s at the start, %s at the end "
           "(above ~0.5: other jobs shared the machine; compare within a round)" % (
               os.cpu_count(), platform.release(), load_start, "%.2f" % os.getloadavg()[0]),
           "- torch %s; safetensors %s; transformers %s; Python %s; nvio %s" % (
               torch.__version__, safetensors.__version__, transformers.__version__,
               platform.python_version(), nvio.__version__),
           "- nvio commit: %s" % subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h %s"],
                                                 capture_output=True, text=True).stdout.strip(),
           disk_line,
           "- command: `%s`" % " ".join(shlex.quote(x) for x in ["python3"] + sys.argv),
           "- model: Llama from a config, %d layers, bf16, random weights, save_pretrained in "
           "%d shards: %d bytes of tensors, %d bytes of files; the save writes one file of "
           "%d bytes" % (a.layers, len(files), nbytes, fsize, ssize),
           "- %s (bench/guestmem.py)" % guest["note"],
           "- %d rounds, interleaved and rotated; page cache dropped before every run; loads "
           "touch every page of every tensor; GB/s = file bytes / seconds (fio: its own "
           "bytes, %d); ratios = median of per-round ratios" % (a.rounds, fbytes), ""]
    out += ["- validation (untimed): " + "; ".join(checks), ""]
    for phase, base in (("load", "st-mmap"), ("save", "st-save")):
        out += core_bench.ratio_table("**%s**" % phase, res[phase], base)
    core_bench.emit(out, a.out)


if __name__ == "__main__":
    main()
