#!/usr/bin/env python3
"""bench/spare_partial_pages.py - a spare save with and without its old bytes
marked unwritten (FALLOC_FL_ZERO_RANGE) against a plain save, interleaved.

libnvio marks a spare's old bytes unwritten at open (since 43b717c): "spare"
measures that; "zr" calls fallocate(ZERO_RANGE) again from here (the same
thing twice: a check that the library did it); "plain" is nvio.save without
spare (a spare is kept around by an untimed spare save before it). Without
the zero range, every buffered write of part of a page (record headers,
unaligned tails) into the spare's written blocks read that page from the
disk first. States from checkpoint_bench.py: small-5000 at 1 GiB or
Llama+AdamW at half size. Needs root (drop_caches).

    python3 bench/spare_partial_pages.py DIR small|llama
"""
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_bench as cb  # noqa: E402
from nvio import _nvio  # noqa: E402
from nvio.checkpoint import _save  # noqa: E402
from nvio._base.plan import Plan  # noqa: E402

libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
ZERO_RANGE = 0x10


def main():
    d, which = sys.argv[1], sys.argv[2]
    p = os.path.join(d, "s.pt")
    sd = cb.small_tensors(5000, 1 << 30) if which == "small" else cb.llama_adamw(0.5)
    nb = sum(s.nbytes() for s in cb.storages(sd))
    h = _save.default_handle()

    def save(mode):
        plan = Plan(sd, p, 4096, 2)
        flags = _nvio.FILE_ATOMIC | (_nvio.FILE_SPARE if mode != "plain" else 0)
        with h.open(p, flags) as nf:
            if mode == "zr":
                sz = os.fstat(nf.fd).st_size
                if sz and libc.fallocate(nf.fd, ZERO_RANGE, 0, sz) != 0:
                    raise OSError(ctypes.get_errno(), "fallocate")
            _save.write_plan(plan, nf)
            nf.commit()

    for m in ("spare", "spare", "zr"):
        save(m)
    res = {}
    for _ in range(3):
        for m in ("plain", "spare", "zr"):
            if m == "plain":
                save("spare")
            cb.core_bench.drop_caches()
            t0 = time.perf_counter()
            save(m)
            res.setdefault(m, []).append("%.2f" % (nb / (time.perf_counter() - t0) / 1e9))
    print(which, "GB/s per round:", res, "load average %.2f" % os.getloadavg()[0])
    for x in (p, os.path.join(d, ".s.pt.nvio-spare")):
        if os.path.exists(x):
            os.unlink(x)


if __name__ == "__main__":
    main()
