#!/usr/bin/env python3
"""Load a file into a CPU tensor with a blocking nvio read (DeepNVMe's sync_pread).

    python examples/aio_load_cpu_tensor.py --input_file /local_nvme/test_1GB.pt
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
    p.add_argument("--loop", type=int, default=3, help="number of loads")
    p.add_argument("--validate", action="store_true", help="compare with Python's read")
    p.add_argument("--direct", choices=["auto", "on", "off"], default="auto",
                   help="O_DIRECT policy (on: bypass the page cache)")
    args = p.parse_args()

    path, made = args.input_file, False
    if path is None:
        fd, path = tempfile.mkstemp(dir=args.folder, suffix=".pt")
        os.close(fd)
        with open(path, "wb") as f:
            f.write(os.urandom(args.mb_size << 20))
        made = True
    n = os.path.getsize(path)

    h = nvio.AioHandle(direct=args.direct)
    t = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
    for i in range(args.loop):
        start = time.perf_counter()
        h.sync_pread(t, path)
        secs = time.perf_counter() - start
        print(f"load {i}: {n / 1e9:.3f} GB in {secs:.3f} s = {n / secs / 1e9:.2f} GB/s "
              f"({h.get_engine()}, direct={h.get_direct()})")
    if args.validate:
        with open(path, "rb") as f:
            ok = f.read() == bytes(t.numpy())
        print("validate:", "OK" if ok else "MISMATCH")
    h.free_cpu_locked_tensor(t)
    if made:
        os.unlink(path)


if __name__ == "__main__":
    main()
