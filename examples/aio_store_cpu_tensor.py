#!/usr/bin/env python3
"""Store a CPU tensor to a file with a blocking nvio write (DeepNVMe's sync_pwrite).

    python examples/aio_store_cpu_tensor.py --folder /local_nvme --mb_size 1024
"""
import argparse
import os
import time

import torch

from nvio.compat import AsyncIOBuilder   # was: from deepspeed.ops.op_builder import ...


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", default="/tmp", help="directory to write into")
    p.add_argument("--mb_size", type=int, default=256, help="tensor size in MiB")
    p.add_argument("--loop", type=int, default=3, help="number of stores")
    p.add_argument("--validate", action="store_true", help="read back and compare")
    p.add_argument("--locked", action="store_true", help="use a page-locked tensor")
    p.add_argument("--fsync", action="store_true", help="make each store durable")
    args = p.parse_args()

    h = AsyncIOBuilder().load().aio_handle()
    n = args.mb_size << 20
    src = torch.randint(0, 256, (n,), dtype=torch.uint8)
    if args.locked:
        t = h.new_cpu_locked_tensor(n, src)
        t.copy_(src)
    else:
        t = src
    path = os.path.join(args.folder, f"nvio_store_{args.mb_size}MB.pt")
    for i in range(args.loop):
        start = time.perf_counter()
        h.sync_pwrite(t, path, fsync=args.fsync)
        secs = time.perf_counter() - start
        print(f"store {i}: {n / 1e9:.3f} GB in {secs:.3f} s = {n / secs / 1e9:.2f} GB/s "
              f"({h.get_engine()})")
    if args.validate:
        with open(path, "rb") as f:
            ok = f.read() == bytes(t.numpy())
        print("validate:", "OK" if ok else "MISMATCH")
    os.unlink(path)
    if args.locked:
        h.free_cpu_locked_tensor(t)


if __name__ == "__main__":
    main()
