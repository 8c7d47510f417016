#!/usr/bin/env python3
"""Load a file in pieces with non-blocking reads and one wait() (async_pread).

Each piece lands in its own tensor at its own file offset; the reads run
while Python does other work. Do not read a tensor before wait().

    python examples/aio_load_async.py --input_file /local_nvme/test_1GB.pt --pieces 8
Without --input_file a file of --mb_size MiB is made first (and removed after).
"""
import argparse
import os
import tempfile
import time

import torch

import nvio


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input_file", help="file to load (default: a new temporary file)")
    p.add_argument("--folder", default="/tmp", help="where the temporary file goes")
    p.add_argument("--mb_size", type=int, default=256, help="size of the temporary file")
    p.add_argument("--pieces", type=int, default=4, help="async reads per load")
    p.add_argument("--loop", type=int, default=3, help="number of loads")
    p.add_argument("--validate", action="store_true", help="compare with Python's read")
    args = p.parse_args()

    path, made = args.input_file, False
    if path is None:
        fd, path = tempfile.mkstemp(dir=args.folder, suffix=".pt")
        os.close(fd)
        with open(path, "wb") as f:
            f.write(os.urandom(args.mb_size << 20))
        made = True
    size = os.path.getsize(path)
    step = -(-size // args.pieces)
    ranges = [(off, min(step, size - off)) for off in range(0, size, step)]

    h = nvio.AioHandle(intra_op_parallelism=2)
    dst = [h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8)) for _, n in ranges]
    for i in range(args.loop):
        start = time.perf_counter()
        for t, (off, _) in zip(dst, ranges):
            h.async_pread(t, path, off)
        busy = sum(range(100000))              # the Python thread keeps working
        done = h.wait()
        secs = time.perf_counter() - start
        print(f"load {i}: {done} reads, {size / 1e9:.3f} GB in {secs:.3f} s = "
              f"{size / secs / 1e9:.2f} GB/s ({busy and h.get_engine()})")
    if args.validate:
        with open(path, "rb") as f:
            ok = f.read() == b"".join(bytes(t.numpy()) for t in dst)
        print("validate:", "OK" if ok else "MISMATCH")
    for t in dst:
        h.free_cpu_locked_tensor(t)
    if made:
        os.unlink(path)


if __name__ == "__main__":
    main()
