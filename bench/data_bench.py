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

    python3 bench/data_bench.py --dir /var/tmp/nvio-data --gb 3 --out bench/results/data-DATE.md

Contenders: megatron-mmap (workers 0 / 2 / 4 through a DataLoader),
megatron-file, numpy.memmap windows, nvio.data IndexedDataset batches
(BatchLoader, main process, prefetch 2; DataLoader 2 workers), nvio.data
TokenWindows; fio --rw=randread --bs=<sample bytes rounded to 4 KiB>
--iodepth 1/32/128/256 (direct, --mem=mmaphuge where huge pages can be had)
and sequential fio-best (1 MiB, depth 32).
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

    def loop(it):
        nonlocal done
        t0 = time.perf_counter()
        for b in it:
            done += len(b) if not isinstance(b, dict) else len(b["x"])
            if time.perf_counter() - t0 > deadline:
                break
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
        if name.endswith("-w2"):
            dl = torch.utils.data.DataLoader(ds, batch_sampler=batches, num_workers=2,
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
    print(json.dumps(dict(name=name, samples=done, secs=secs, sps=done / secs,
                          gbps=done * (args.tokens + 1) * isz / secs / 1e9, **extra)))


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
    print("%-22s %8.0f samples/s %6.3f GB/s  (%d samples, %.1f s) %s" % (
        name, res["sps"], res["gbps"], res["samples"], res["secs"], res.get("direct", "")))
    return res


def run_fio(path, bs, depth, rw, seconds, huge):
    mem = ["--iomem=mmaphuge:%s" % huge] if huge else []
    cmd = ["fio", "--name=r", "--filename=%s" % path, "--rw=%s" % rw, "--bs=%d" % bs,
           "--iodepth=%d" % depth, "--ioengine=io_uring", "--direct=1", "--runtime=%d" % seconds,
           "--time_based", "--output-format=json", "--readonly", "--norandommap",
           "--randrepeat=0"] + mem
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    if r.returncode:
        return dict(error=r.stderr[-300:])
    j = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]["read"]
    return dict(iops=j["iops"], gbps=j["bw_bytes"] / 1e9)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/var/tmp/nvio-data-bench")
    ap.add_argument("--gb", type=float, default=3.0, help="corpus size (GB)")
    ap.add_argument("--tokens", type=int, default=2048, help="sample = tokens + 1")
    ap.add_argument("--dtype", default="int32", choices=["int32", "uint16"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--seconds", type=float, default=20.0, help="time box per contender")
    ap.add_argument("--depth", type=int, default=128, help="nvio queue depth")
    ap.add_argument("--limit-frac", type=float, default=1 / 3)
    ap.add_argument("--contenders", default="megatron-mmap,megatron-mmap-w2,megatron-mmap-w4,"
                    "megatron-file,numpy-memmap,nvio-indexed,nvio-indexed-w2,nvio-windows")
    ap.add_argument("--fio-depths", default="1,32,128,256")
    ap.add_argument("--warm", action="store_true", help="also: no limit, corpus cached")
    ap.add_argument("--out")
    ap.add_argument("--run")
    ap.add_argument("--prefix")
    ap.add_argument("--cgroup")
    ap.add_argument("--pass-no", type=int, default=0)
    args = ap.parse_args()
    if args.run:
        return child(args)
    import numpy as np
    os.makedirs(args.dir, exist_ok=True)
    args.prefix = os.path.join(args.dir, "corpus_%s_%d" % (args.dtype, args.tokens + 1))
    build_corpus(args.prefix, args.gb, args.tokens, np.dtype(args.dtype))
    size = os.path.getsize(args.prefix + ".bin")
    limit = int(size * args.limit_frac)
    sample = (args.tokens + 1) * np.dtype(args.dtype).itemsize
    load0 = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    cg = make_group(limit)
    rows, fio = [], {}
    try:
        for name in args.contenders.split(","):
            drop_caches()
            rows.append(("limited", run_child(args, name, cg)))
        # fio at the sample size rounded to 4 KiB (O_DIRECT), and at the
        # 4 KiB pages an unaligned sample spans (what a direct read of one moves)
        bs = (sample + 4095) // 4096 * 4096 if sample % 4096 > 64 else sample // 4096 * 4096
        span = (sample + 4095) // 4096 * 4096
        huge = None
        try:
            sys.path.insert(0, HERE)
            import hugepages
            ctx = hugepages.reserved(64 << 20, print)
            huge = ctx.__enter__()
        except Exception as e:  # noqa: BLE001
            print("no huge pages for fio: %s" % e)
            ctx = None
        try:
            for d in [int(x) for x in args.fio_depths.split(",") if x]:
                fio["randread %d B qd%d" % (bs, d)] = r = run_fio(args.prefix + ".bin", bs, d,
                                                                  "randread", 10, huge)
                print("fio randread bs=%d qd%d: %s" % (bs, d, r))
            if span != bs:
                fio["randread %d B qd128" % span] = r = run_fio(args.prefix + ".bin", span, 128,
                                                                "randread", 10, huge)
                print("fio randread bs=%d qd128: %s" % (span, r))
            fio["read 1 MiB qd32 (fio-best)"] = r = run_fio(args.prefix + ".bin", 1 << 20, 32,
                                                            "read", 10, huge)
            print("fio seq: %s" % r)
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
        if args.warm:
            for name in ("megatron-mmap", "nvio-indexed"):
                drop_caches()
                rows.append(("cold, no limit", run_child(args, name, None, 1)))
            subprocess.run("cat %s > /dev/null" % (args.prefix + ".bin"), shell=True)
            for k, name in enumerate(("megatron-mmap", "nvio-indexed") * 2):
                rows.append(("warm, no limit", run_child(args, name, None, 2 + k // 2)))
    finally:
        remove_group(cg)
    load1 = os.getloadavg()
    report(args, rows, fio, size, limit, sample, cg, load0, load1, started)


def report(args, rows, fio, size, limit, sample, cg, load0, load1, started):
    fio128 = next((v for k, v in fio.items() if k.endswith("qd128") and "iops" in v), None)
    fio128_name = next((k for k, v in fio.items() if v is fio128), "-")
    mm = {(c, r["name"]): r for c, r in rows if "sps" in r}
    lines = ["# nvio.data benchmark — %s" % started.strftime("%Y-%m-%d"), "",
             "- date: %s; load average %s at the start, %s at the end (a shared 2-core VM: "
             "other sessions' builds and tests ran meanwhile)" % (
                 started.strftime("%Y-%m-%d %H:%M UTC"), " ".join("%.1f" % x for x in load0),
                 " ".join("%.1f" % x for x in load1)),
             "- machine: %d cores (%s), %s RAM, kernel %s; disk %s" % (
                 os.cpu_count(), sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip(),
                 sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo"),
                 platform.release(), sh("findmnt -n -o SOURCE,FSTYPE --target %s" % args.dir)),
             "- nvio git %s; torch %s; megatron-core %s; %s" % (
                 sh("git -C %s rev-parse --short HEAD" % REPO),
                 sh("%s -c 'import torch;print(torch.__version__)'" % sys.executable),
                 sh("%s -c 'import megatron.core as m;print(m.__version__)' 2>/dev/null"
                    % sys.executable), sh("fio --version")),
             "- command: `python3 bench/data_bench.py %s`" % " ".join(sys.argv[1:]),
             "- corpus: %.2f GB of %s tokens written by megatron-core's IndexedDatasetBuilder, "
             "samples of %d tokens (%d B), shuffled; batches of %d; at most %d samples or %.0f s "
             "per contender, the read loop timed inside its process; page cache dropped before "
             "each" % (size / 1e9, args.dtype, args.tokens + 1, sample, args.batch, args.samples,
                       args.seconds),
             "- memory limit: %s" % ("cgroup v1 %s, memory.limit_in_bytes = %d (%.2f GiB, %.2f of "
                                     "the corpus; it charges the page cache)" % (
                                         cg, limit, limit / 2**30, limit / size) if cg else
                                     "none could be made (no cgroup v1 memory controller)"),
             "", "| contender | case | samples/s | GB/s | × fio %s | × megatron-mmap "
             "| samples | I/O mode |" % fio128_name, "|---|---|---:|---:|---:|---:|---:|---|"]
    for case, r in rows:
        if "sps" not in r:
            lines.append("| %s | %s | failed: %s | | | | | |" % (r["name"], case, r["error"][:120]))
            continue
        base = mm.get((case, "megatron-mmap"))
        lines.append("| %s | %s | %.0f | %.3f | %s | %s | %d | %s |" % (
            r["name"], case, r["sps"], r["gbps"],
            "%.2f" % (r["sps"] / fio128["iops"]) if fio128 else "-",
            "%.1f" % (r["sps"] / base["sps"]) if base else "-", r["samples"],
            r.get("direct", "page cache (mmap / read)") if r["name"].startswith("nvio") else
            "page cache"))
    lines += ["", "fio (io_uring, O_DIRECT, %s, 10 s each):" % ("buffers in huge pages"
                                                             if fio else "-"), "",
              "| job | IOPS | GB/s |", "|---|---:|---:|"]
    for k, v in fio.items():
        lines.append("| %s | %s | %s |" % (k, "%.0f" % v["iops"] if "iops" in v else v,
                                            "%.3f" % v["gbps"] if "gbps" in v else ""))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
