#!/usr/bin/env python3
"""bench/data_bench.py - training samples per second: nvio.data against
Megatron's IndexedDataset (mmap and file readers), numpy.memmap windows
(nanoGPT's loader) and fio's random reads of the sample size.

A corpus written by megatron-core's IndexedDatasetBuilder (int32 or uint16
tokens, every sequence one sample of --tokens + 1 tokens) is read in a
shuffled order, --batch samples a batch, for at most --samples samples or
--seconds seconds per contender (the read loop timed inside its process).
Each contender runs in its own process, from a cold page cache, inside a
cgroup v1 memory group limited to --limit-frac of the corpus
(memory.limit_in_bytes charges the page cache); with --warm the
page-cache-friendly case too: no limit, the corpus cached first.

    python3 bench/data_bench.py --out bench/results/data-DATE.md

runs the whole matrix in about 6 minutes on a quiet machine (corpora built
once and kept in --dir: 3 GB int32 and 3 GB uint16). A contender is
NAME or NAME@BATCH:
megatron-mmap / megatron-file (Megatron's IndexedDataset, its mmap and file
readers; -w2 / -w4: through a DataLoader with 2 / 4 workers, else 0),
numpy-memmap (nanoGPT's random windows), nvio-indexed (nvio.data's
IndexedDataset: BatchLoader from the main process, prefetch 2; -w2 / -w4:
DataLoader workers, each its own handle), nvio-windows (TokenWindows,
BatchLoader). fio: --rw=randread --bs=<sample bytes, 4 KiB multiple>
--iodepth 1/32/128/256 (direct, io_uring, huge-page buffers where they can
be had), the covering 4 KiB pages at depth 128 (what an unaligned sample's
direct read moves; the 512-byte sectors it covers where the file system
takes such offsets) and sequential fio-best (1 MiB, depth 32). The first
target is checked on --pairs interleaved rounds of nvio-indexed and fio
(the median of the per-round ratios: the disk's speed drifts). --warm (on
by default) adds the page-cache-friendly cases: no limit, cold, then warm.
The markdown (--out) holds the command, load averages, every row, and the
issue's three targets checked.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
CG_ROOT = None


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=60).stdout.strip()
    except Exception:  # noqa: BLE001
        return "?"


# --- the memory cgroup -----------------------------------------------------------


def own_memory_cgroup():
    """This process's cgroup v1 memory directory, or None."""
    try:
        for line in open("/proc/self/cgroup"):
            _, ctrl, rel = line.strip().split(":", 2)
            if "memory" in ctrl.split(","):
                d = os.path.join("/sys/fs/cgroup/memory", rel.lstrip("/"))
                return d if os.path.exists(os.path.join(d, "memory.limit_in_bytes")) else None
    except OSError:
        return None
    return None


def make_group(limit):
    base = own_memory_cgroup()
    if base is None:
        return None
    d = os.path.join(base, "nvio-data-bench-%d" % os.getpid())
    try:
        os.mkdir(d)
        with open(os.path.join(d, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
    except OSError as e:
        print("no cgroup v1 memory group: %s" % e)
        return None
    return d


def remove_group(d):
    if d:
        try:
            os.rmdir(d)
        except OSError as e:
            print("could not remove %s: %s" % (d, e))


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


# --- the corpus ------------------------------------------------------------------------


def build_corpus(prefix, gb, tokens, dtype):
    import numpy as np
    if os.path.exists(prefix + ".idx"):
        return
    import torch  # noqa: F401  (megatron's builder takes tensors)
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    isz = np.dtype(dtype).itemsize
    per = tokens + 1
    n = int(gb * 1e9 / (per * isz))
    rng = np.random.default_rng(0)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.dtype(dtype).type)
    chunk = 4096
    t = time.time()
    for s in range(0, n, chunk):
        k = min(chunk, n - s)
        toks = rng.integers(0, 50000, k * per, dtype=np.int64)
        b.add_document(toks, [per] * k)
    b.finalize(prefix + ".idx.part")
    os.sync()
    os.rename(prefix + ".idx.part", prefix + ".idx")      # a corpus exists whole or not at all
    print("corpus: %d samples of %d tokens (%s), %.2f GB in %.0f s" % (
        n, per, np.dtype(dtype).name, n * per * isz / 1e9, time.time() - t))


# --- contenders (each in a child process) ---------------------------------------------


def child(args):
    """Run one contender; print its JSON result."""
    if args.cgroup:
        with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    import warnings
    warnings.filterwarnings("ignore")
    import numpy as np
    import torch
    torch.set_num_threads(1)
    prefix, name = args.prefix, args.run
    if "@" in name:
        name, b = name.split("@")
        args.batch = int(b)
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MI
    n_all = len(MI(prefix).sequence_lengths)
    # each contender its own shuffle: this VM's disk is a file cached by the
    # host, so samples read by an earlier contender would come back faster
    seed = sum(map(ord, name)) * 7919 + (1 << 20) * args.pass_no
    order = np.random.default_rng(seed).permutation(n_all)[:args.samples]
    batches = [order[i:i + args.batch].tolist() for i in range(0, len(order), args.batch)]
    deadline = args.seconds
    done = 0
    extra = {}

    cpu = [0.0]

    def loop(it):
        nonlocal done
        c0 = time.process_time()
        t0 = time.perf_counter()
        for b in it:
            done += len(b) if not isinstance(b, dict) else len(b["x"])
            if time.perf_counter() - t0 > deadline:
                break
        cpu[0] = time.process_time() - c0       # this process's threads (not workers')
        return time.perf_counter() - t0

    if name.startswith("megatron"):
        ds = MI(prefix, mmap=not name.startswith("megatron-file"))
        w = int(name.rsplit("-w", 1)[1]) if "-w" in name else 0

        class Samples(torch.utils.data.Dataset):
            def __len__(self):
                return n_all

            def __getitem__(self, i):
                return torch.from_numpy(np.array(ds[i]))     # GPTDataset copies too

        dl = torch.utils.data.DataLoader(Samples(), batch_sampler=batches, num_workers=w,
                                         persistent_workers=False)
        secs = loop(dl)
    elif name == "numpy-memmap":
        data = np.memmap(prefix + ".bin", dtype=np.dtype(args.dtype), mode="r")
        per = args.tokens + 1
        starts = np.random.default_rng(seed).integers(0, len(data) - per, len(order))

        def gen():
            for i in range(0, len(starts), args.batch):
                batch = starts[i:i + args.batch]
                yield torch.from_numpy(np.stack([data[s:s + per] for s in batch]))
        secs = loop(gen())
    elif name.startswith("nvio-indexed"):
        import nvio.data as nd
        ds = nd.IndexedDataset(prefix, queue_depth=args.depth)
        extra["direct"] = ds.direct_why
        w = int(name.rsplit("-w", 1)[1]) if "-w" in name else 0
        if w:
            dl = torch.utils.data.DataLoader(ds, batch_sampler=batches, num_workers=w,
                                             collate_fn=nd.collate)
            secs = loop(dl)
        else:
            secs = loop(nd.BatchLoader(ds, batch_sampler=batches, prefetch=2))
    elif name == "nvio-windows":
        import nvio.data as nd
        ds = nd.TokenWindows(prefix + ".bin", args.tokens, dtype=np.dtype(args.dtype),
                             header=0, queue_depth=args.depth)
        extra["direct"] = ds.direct_why
        starts = np.random.default_rng(seed).integers(0, len(ds), len(order)).tolist()
        bs = [starts[i:i + args.batch] for i in range(0, len(starts), args.batch)]
        secs = loop(nd.BatchLoader(ds, batch_sampler=bs, prefetch=2))
    else:
        raise SystemExit("unknown contender %s" % name)
    isz = np.dtype(args.dtype).itemsize
    print(json.dumps(dict(name=args.run, samples=done, secs=secs, sps=done / secs,
                          gbps=done * (args.tokens + 1) * isz / secs / 1e9,
                          cpu_us=cpu[0] / max(done, 1) * 1e6, batch=args.batch, **extra)))


def run_child(args, name, cgroup, pass_no=0):
    cmd = [sys.executable, os.path.abspath(__file__), "--run", name, "--prefix", args.prefix,
           "--samples", str(args.samples), "--batch", str(args.batch), "--tokens",
           str(args.tokens), "--dtype", args.dtype, "--seconds", str(args.seconds),
           "--depth", str(args.depth), "--pass-no", str(pass_no)] + (
               ["--cgroup", cgroup] if cgroup else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds * 6 + 300)
    if r.returncode:
        print("%s failed (%d): %s" % (name, r.returncode, r.stderr[-1500:]))
        return dict(name=name, error="exit %d: %s" % (r.returncode, r.stderr.strip()[-300:]))
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print("%-22s %8.0f samples/s %6.3f GB/s  (%d samples, %.1f s, %.1f us CPU each) %s" % (
        name, res["sps"], res["gbps"], res["samples"], res["secs"], res["cpu_us"],
        res.get("direct", "")), flush=True)
    return res


def run_fio(path, bs, depth, rw, seconds, huge, blockalign=None):
    mem = ["--iomem=mmaphuge:%s" % huge] if huge else []
    mem += ["--blockalign=%d" % blockalign] if blockalign else []
    cmd = ["fio", "--name=r", "--filename=%s" % path, "--rw=%s" % rw, "--bs=%d" % bs,
           "--iodepth=%d" % depth, "--ioengine=io_uring", "--direct=1", "--runtime=%d" % seconds,
           "--time_based", "--output-format=json", "--readonly", "--norandommap",
           "--randrepeat=0"] + mem
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    if r.returncode:
        return dict(error=r.stderr[-300:])
    j = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]["read"]
    return dict(iops=j["iops"], gbps=j["bw_bytes"] / 1e9)


def fio_rows(args, prefix, sample, depths, huge):
    """fio at the sample size (a 4 KiB multiple: O_DIRECT), at the 512-byte
    sectors an unaligned sample of 4-byte tokens covers (what nvio's direct
    read of one moves where the file system takes 512-byte offsets), at the
    4 KiB pages it spans, and sequential fio-best."""
    bs = (sample + 4095) // 4096 * 4096 if sample % 4096 > 64 else sample // 4096 * 4096
    span = (sample + 4095) // 4096 * 4096
    sectors = (sample + 511) // 512 * 512
    out = {}
    for d in depths:
        out["randread %d B qd%d" % (bs, d)] = r = run_fio(prefix + ".bin", bs, d, "randread",
                                                          args.fio_seconds, huge)
        print("fio randread bs=%d qd%d: %s" % (bs, d, r), flush=True)
    if sectors != bs:
        out["randread %d B qd128 (sectors of an unaligned sample)" % sectors] = r = run_fio(
            prefix + ".bin", sectors, 128, "randread", args.fio_seconds, huge, blockalign=512)
        print("fio randread bs=%d qd128 blockalign=512: %s" % (sectors, r), flush=True)
    if span != bs:
        out["randread %d B qd128 (pages of an unaligned sample)" % span] = r = run_fio(
            prefix + ".bin", span, 128, "randread", args.fio_seconds, huge)
        print("fio randread bs=%d qd128: %s" % (span, r), flush=True)
    if args.fio_best:
        out["read 1 MiB qd32 (fio-best)"] = r = run_fio(prefix + ".bin", 1 << 20, 32, "read",
                                                        args.fio_seconds, huge)
        print("fio seq: %s" % r, flush=True)
    return out, "randread %d B qd128" % bs


def corpus_run(args, dtype, contenders, fio_depths, warm):
    """One corpus: every contender limited, fio, and (warm) the cases
    without a limit. A dict for report()."""
    import numpy as np
    a = argparse.Namespace(**vars(args))
    a.dtype = dtype
    a.prefix = os.path.join(args.dir, "corpus_%s_%d" % (dtype, args.tokens + 1))
    build_corpus(a.prefix, args.gb, args.tokens, np.dtype(dtype))
    size = os.path.getsize(a.prefix + ".bin")
    limit = int(size * args.limit_frac)
    sample = (args.tokens + 1) * np.dtype(dtype).itemsize
    cg = make_group(limit)
    rows, fio, fio_ref, pairs = [], {}, None, []
    try:
        for name in contenders:
            drop_caches()
            rows.append(("limited", run_child(a, name, cg)))
        huge, ctx = None, None
        try:
            sys.path.insert(0, HERE)
            import hugepages
            ctx = hugepages.reserved(64 << 20, print)
            huge = ctx.__enter__()
        except Exception as e:  # noqa: BLE001
            print("no huge pages for fio: %s" % e)
            ctx = None
        try:
            fio, fio_ref = fio_rows(a, a.prefix, sample, fio_depths, huge)
            bs = int(fio_ref.split()[1])
            for k in range(args.pairs if cg else 0):
                # the target's pairs: nvio then fio, back to back, each round
                drop_caches()
                nv = run_child(a, "nvio-indexed", cg, 50 + k)
                f = run_fio(a.prefix + ".bin", bs, 128, "randread", args.fio_seconds, huge)
                print("pair %d: nvio-indexed %s / fio %s" % (k, nv.get("sps"), f.get("iops")),
                      flush=True)
                pairs.append((nv, f))
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
        if warm:
            for name in ("megatron-mmap", "nvio-indexed"):
                drop_caches()
                rows.append(("cold, no limit", run_child(a, name, None, 1)))
            for k, name in enumerate(("megatron-mmap", "nvio-indexed") * 2):
                # cached again before each: on a shared machine another
                # benchmark may have dropped the page cache meanwhile
                subprocess.run("cat %s > /dev/null" % (a.prefix + ".bin"), shell=True)
                rows.append(("warm, no limit", run_child(a, name, None, 2 + k // 2)))
    finally:
        remove_group(cg)
    return dict(dtype=dtype, rows=rows, fio=fio, fio_ref=fio_ref, size=size, limit=limit,
                sample=sample, cg=cg, pairs=pairs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/var/tmp/nvio-data-bench")
    ap.add_argument("--gb", type=float, default=3.0, help="corpus size (GB)")
    ap.add_argument("--tokens", type=int, default=2048, help="sample = tokens + 1")
    ap.add_argument("--dtype", default="int32", choices=["int32", "uint16"])
    ap.add_argument("--batch", type=int, default=256, help="unless NAME@BATCH says")
    ap.add_argument("--samples", type=int, default=100000)
    ap.add_argument("--seconds", type=float, default=5.0, help="time box per contender")
    ap.add_argument("--depth", type=int, default=128, help="nvio queue depth")
    ap.add_argument("--limit-frac", type=float, default=1 / 3)
    ap.add_argument("--contenders", default="megatron-mmap,megatron-mmap-w2,megatron-mmap-w4,"
                    "megatron-file,megatron-file-w2,megatron-file-w4,numpy-memmap,"
                    "nvio-indexed,nvio-indexed@64,nvio-indexed@512,nvio-indexed-w2,"
                    "nvio-indexed-w4,nvio-windows")
    ap.add_argument("--fio-depths", default="1,32,128,256")
    ap.add_argument("--fio-seconds", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=5,
                    help="interleaved rounds of nvio-indexed (limited) and fio randread at "
                    "depth 128 for the first target: the median of their ratios")
    ap.add_argument("--u16-contenders", default="megatron-mmap,megatron-file,numpy-memmap,"
                    "nvio-indexed,nvio-windows",
                    help="a second corpus of uint16 tokens ('' for none)")
    ap.add_argument("--no-warm", dest="warm", action="store_false",
                    help="skip the cases without a memory limit")
    ap.add_argument("--out")
    ap.add_argument("--run")
    ap.add_argument("--prefix")
    ap.add_argument("--cgroup")
    ap.add_argument("--pass-no", type=int, default=0)
    args = ap.parse_args()
    args.fio_best = True
    if args.run:
        return child(args)
    os.makedirs(args.dir, exist_ok=True)
    load0 = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.time()
    depths = [int(x) for x in args.fio_depths.split(",") if x]
    runs = [corpus_run(args, args.dtype, args.contenders.split(","), depths, args.warm)]
    u16 = [c for c in args.u16_contenders.split(",") if c]
    if u16 and args.dtype != "uint16":
        args.fio_best = False
        runs.append(corpus_run(args, "uint16", u16, [128], False))
    load1 = os.getloadavg()
    report(args, runs, load0, load1, started, time.time() - t0)


def _targets(run):
    """The issue's targets, checked on one corpus's rows."""
    by = {}
    for case, r in run["rows"]:
        if "sps" in r:
            by.setdefault((case, r["name"]), []).append(r["sps"])
    fio = run["fio"].get(run["fio_ref"] or "", {})
    out = []
    nv = by.get(("limited", "nvio-indexed"))
    ok = [(n["sps"], f["iops"]) for n, f in run.get("pairs", ()) if "sps" in n and "iops" in f]
    if ok:
        ratios = sorted(n / f for n, f in ok)
        med = ratios[len(ratios) // 2] if len(ratios) % 2 else \
            (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2
        out.append("- limited page cache, one process, %d interleaved rounds (nvio-indexed, then "
                   "fio %s): median %.2fx (rounds %s; nvio %s samples/s, fio %s IOPS); target "
                   ">= 0.8x: %s" % (len(ok), run["fio_ref"], med,
                                    " ".join("%.2f" % x for x in ratios),
                                    "/".join("%.0f" % n for n, _ in ok),
                                    "/".join("%.0f" % f for _, f in ok),
                                    "met" if med >= 0.8 else "NOT met"))
    elif nv and "iops" in fio:
        x = nv[0] / fio["iops"]
        out.append("- limited page cache, one process: nvio-indexed %.0f samples/s = %.2fx fio %s "
                   "(%.0f IOPS); target >= 0.8x: %s" % (nv[0], x, run["fio_ref"], fio["iops"],
                                                        "met" if x >= 0.8 else "NOT met"))
    for case, want, what in (("cold, no limit", 5.0, ">= 5x"), ("warm, no limit", 1.0, ">= 1x")):
        n, m = by.get((case, "nvio-indexed")), by.get((case, "megatron-mmap"))
        if n and m:
            x = max(n) / max(m)
            out.append("- %s: nvio-indexed %.0f against megatron-mmap %.0f samples/s (best of "
                       "each) = %.1fx; target %s: %s" % (case, max(n), max(m), x, what,
                                                         "met" if x >= want else "NOT met"))
    return out


def report(args, runs, load0, load1, started, elapsed):
    lines = ["# nvio.data benchmark — %s" % started.strftime("%Y-%m-%d"), "",
             "- date: %s; load average %s at the start, %s at the end; the whole run took "
             "%.0f s" % (started.strftime("%Y-%m-%d %H:%M UTC"),
                         " ".join("%.1f" % x for x in load0), " ".join("%.1f" % x for x in load1),
                         elapsed),
             "- machine: %d cores (%s), %s RAM, kernel %s; disk %s" % (
                 os.cpu_count(), sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip(),
                 sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo"),
                 platform.release(), sh("findmnt -n -o SOURCE,FSTYPE --target %s" % args.dir)),
             "- nvio git %s%s; torch %s; megatron-core %s; %s" % (
                 sh("git -C %s rev-parse --short HEAD" % REPO),
                 " (+ uncommitted changes)" if sh("git -C %s status --porcelain -- python src"
                                                  % REPO) else "",
                 sh("%s -c 'import torch;print(torch.__version__)'" % sys.executable),
                 sh("%s -c 'import megatron.core as m;print(m.__version__)' 2>/dev/null"
                    % sys.executable), sh("fio --version")),
             "- command: `python3 bench/data_bench.py %s`" % " ".join(sys.argv[1:]),
             "- each contender in its own process, page cache dropped before it, its own "
             "shuffle; at most %d samples or %.0f s each, the read loop timed inside the process "
             "(CPU: that process's threads, not its DataLoader workers'); batches of %d unless "
             "NAME@BATCH; nvio queue depth %d" % (args.samples, args.seconds, args.batch,
                                                  args.depth)]
    for run in runs:
        lines += _corpus_report(args, run)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


def _corpus_report(args, run):
    fio = run["fio"]
    ref = fio.get(run["fio_ref"] or "", {})
    ref = ref if "iops" in ref else None
    mm = {(c, r["name"]): r for c, r in run["rows"] if "sps" in r}
    cg, size, limit = run["cg"], run["size"], run["limit"]
    lines = ["", "## %s tokens, samples of %d tokens (%d B)" % (run["dtype"], args.tokens + 1,
                                                               run["sample"]), "",
             "- corpus: %.2f GB written by megatron-core's IndexedDatasetBuilder, shuffled" % (
                 size / 1e9),
             "- memory limit (case 'limited'): %s" % (
                 "cgroup v1 memory.limit_in_bytes = %d (%.2f GiB, %.2f of the corpus; it charges "
                 "the page cache)" % (limit, limit / 2**30, limit / size) if cg else
                 "none could be made (no cgroup v1 memory controller)"),
             "", "### Targets", ""] + (_targets(run) or ["- (rows missing)"]) + [
             "", "| contender | case | batch | samples/s | GB/s | × fio %s | × megatron-mmap "
             "| CPU us/sample | samples | I/O mode |" % (run["fio_ref"] or "-"),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for case, r in run["rows"]:
        if "sps" not in r:
            lines.append("| %s | %s | | failed: %s | | | | | | |" % (
                r["name"], case, r["error"][:120].replace("|", "/").replace("\n", " ")))
            continue
        base = mm.get((case, "megatron-mmap"))
        mode = r.get("direct", "page cache (mmap / read)") if r["name"].startswith("nvio") \
            else "page cache"
        lines.append("| %s | %s | %d | %.0f | %.3f | %s | %s | %.1f | %d | %s |" % (
            r["name"].split("@")[0], case, r.get("batch", args.batch), r["sps"], r["gbps"],
            "%.2f" % (r["sps"] / ref["iops"]) if ref else "-",
            "%.1f" % (r["sps"] / base["sps"]) if base else "-", r.get("cpu_us", 0),
            r["samples"], mode.split(":")[0]))
    lines += ["", "fio (io_uring, O_DIRECT, %d s each; huge-page buffers where they could be "
              "had):" % args.fio_seconds, "", "| job | IOPS | GB/s |", "|---|---:|---:|"]
    for k, v in fio.items():
        lines.append("| %s | %s | %s |" % (k, "%.0f" % v["iops"] if "iops" in v else v,
                                            "%.3f" % v["gbps"] if "gbps" in v else ""))
    why = sorted({r.get("direct") for _, r in run["rows"] if r.get("direct")})
    if why:
        lines += ["", "nvio's direct-or-cached choice (direct=\"auto\"), as each run reported "
                  "it:", ""] + ["- %s" % w for w in why]
    return lines


if __name__ == "__main__":
    main()
