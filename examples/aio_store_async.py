#!/usr/bin/env python3
"""Store several CPU tensors with non-blocking writes and one wait() (async_pwrite).

The Python thread is free while the writes run: here it fills the next
batch of tensors. Do not modify a tensor before the wait() that covers it.

    python examples/aio_store_async.py --folder /local_nvme --count 8 --mb_size 128
"""
import argparse
import os
import time

import torch

import nvio


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", default="/tmp", help="directory to write into")
    p.add_argument("--count", type=int, default=4, help="tensors (files) per batch")
    p.add_argument("--mb_size", type=int, default=64, help="size of each tensor in MiB")
    p.add_argument("--loop", type=int, default=3, help="number of batches")
    p.add_argument("--intra_op_parallelism", type=int, default=2)
    p.add_argument("--validate", action="store_true", help="read back and compare")
    args = p.parse_args()

    h = nvio.AioHandle(intra_op_parallelism=args.intra_op_parallelism)
    n = args.mb_size << 20
    batches = [[torch.randint(0, 256, (n,), dtype=torch.uint8) for _ in range(args.count)]
               for _ in range(2)]
    paths = [os.path.join(args.folder, f"nvio_async_{k}.pt") for k in range(args.count)]
    for i in range(args.loop):
        ts = batches[i % 2]
        start = time.perf_counter()
        for t, path in zip(ts, paths):
            assert h.async_pwrite(t, path) == 0
        other = batches[(i + 1) % 2]          # overlap: prepare the other batch
        for t in other:
            t.random_(0, 256)
        done = h.wait()
        secs = time.perf_counter() - start
        total = n * args.count
        print(f"batch {i}: {done} stores, {total / 1e9:.3f} GB in {secs:.3f} s = "
              f"{total / secs / 1e9:.2f} GB/s")
    if args.validate:
        last = batches[(args.loop - 1) % 2]
        ok = all(open(pth, "rb").read() == bytes(t.numpy()) for t, pth in zip(last, paths))
        print("validate:", "OK" if ok else "MISMATCH")
    for path in paths:
        os.unlink(path)


if __name__ == "__main__":
    main()
