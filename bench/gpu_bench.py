#!/usr/bin/env python3
"""GPU benchmark: 1 GiB HBM->file and file->HBM through AioHandle (bounce
buffers) and GdsHandle (cuFile), against host-memory transfers on the same
disk (page-locked CPU tensor) and torch.save/torch.load of the same tensor,
in interleaved rounds (../shared/BENCHMARKING.md). GB = 10^9 bytes.

Prints a markdown table: median GB/s, min-max, and the median of per-round
ratios against the host-memory figure (target: bounce >= 0.9x host).
"""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

import nvio


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--size", type=int, default=1 << 30, help="bytes (default 1 GiB)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--parallelism", type=int, default=8)
    ap.add_argument("--out", help="write the markdown table here too")
    a = ap.parse_args()

    n = a.size
    path = os.path.join(a.dir, f"nvio-gpu-bench-{os.getpid()}.bin")
    kw = dict(block_size=8 << 20, queue_depth=32, intra_op_parallelism=a.parallelism,
              overlap_events=True)
    aio, gds = nvio.AioHandle(**kw), nvio.GdsHandle(**kw)
    gpu = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    host = aio.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
    host.copy_(gpu.cpu())
    gds_buf = gds.new_pinned_device_tensor(n, torch.empty(0, dtype=torch.uint8))
    gds_buf.copy_(gpu)
    cold = drop_caches()

    def nothing():
        pass

    def fresh_file():
        """The file every read reads, written by nvio, then out of the cache."""
        aio.sync_pwrite(host, path)
        drop_caches()

    def fsynced(write):
        """An nvio write and then fsync of the file, as torch.save gets:
        every write contender ends with its data on the device."""
        def run():
            write()
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return run

    def tsave():
        with open(path, "wb") as f:
            torch.save(gpu, f)
            f.flush()
            os.fsync(f.fileno())

    def saved_file():
        tsave()
        drop_caches()

    # name: (prepare, timed transfer)
    contenders = {
        "write host (locked CPU tensor)": (nothing, fsynced(lambda: aio.sync_pwrite(host, path))),
        "write HBM AioHandle (bounce)": (nothing, fsynced(lambda: aio.sync_pwrite(gpu, path))),
        "write HBM GdsHandle": (nothing, fsynced(lambda: gds.sync_pwrite(gds_buf, path))),
        "write torch.save": (nothing, tsave),
        "read host (locked CPU tensor)": (fresh_file, lambda: aio.sync_pread(host, path)),
        "read HBM AioHandle (bounce)": (fresh_file, lambda: aio.sync_pread(gpu, path)),
        "read HBM GdsHandle": (fresh_file, lambda: gds.sync_pread(gds_buf, path)),
        "read torch.load": (saved_file, lambda: torch.load(path, map_location="cuda")),
    }
    secs = {k: [] for k in contenders}
    for rnd in range(a.rounds):
        for k, (prepare, fn) in contenders.items():
            prepare()
            secs[k].append(timed(fn))
            print(f"round {rnd + 1}/{a.rounds} {k}: {n / secs[k][-1] / 1e9:.2f} GB/s",
                  file=sys.stderr)
    os.unlink(path)
    ok = torch.equal(gpu, gds_buf) and torch.equal(gpu.cpu(), host)

    mode, why = nvio.gds_mode()
    lines = [
        f"GPU benchmark, {time.strftime('%Y-%m-%d')}: {torch.cuda.get_device_name()}, "
        f"{platform.node()}, kernel {platform.release()}, torch {torch.__version__}",
        f"dir {a.dir} (size {n} B, rounds {a.rounds}, handle {kw}; every write ends with "
        f"fsync); cuFile: {mode} ({why}); "
        f"cold reads: {'drop_caches' if cold else 'O_DIRECT only (drop_caches refused)'}; "
        f"data check: {'ok' if ok else 'MISMATCH'}",
        f"command: python3 bench/gpu_bench.py {' '.join(sys.argv[1:])}",
        "",
        "| transfer | GB/s median | min-max | ratio vs host (median of rounds) |",
        "|---|---|---|---|",
    ]
    for k, s in secs.items():
        gbs = [n / x / 1e9 for x in s]
        base = "write host (locked CPU tensor)" if k.startswith("write") else \
            "read host (locked CPU tensor)"
        ratio = statistics.median(secs[base][i] / s[i] for i in range(len(s)))
        lines.append(f"| {k} | {statistics.median(gbs):.2f} | {min(gbs):.2f}-{max(gbs):.2f} "
                     f"| {ratio:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    subprocess.run(["nvidia-smi", "-L"], check=False)


if __name__ == "__main__":
    main()
