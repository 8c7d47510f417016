"""The CRC pool: CRC-32s of tensor bytes computed in threads.

``crc_submit`` cuts host memory regions into chunks and deals them to a few
threads, each one ``nvio_crc32_many`` call (carry-less multiplication where
the CPU has it, several times zlib's speed; it releases the GIL); the
chunks of a region are joined with ``crc32_combine``. ``crc_device``
checksums device memory through chunked copies to the host. Used by every
writer (checkpoint, dcp, safetensors, offload) and by the loads that verify.
"""
from __future__ import annotations

import concurrent.futures
import os
import queue
import threading

import torch

from .. import _device, _nvio

#: Bytes of tensor data per CRC task.
CRC_CHUNK = 32 << 20
#: Bytes of a device storage copied to the host at a time for its CRC-32.
DEVICE_CRC_CHUNK = 8 << 20


def crc32_combine(crc1, crc2, len2):
    """CRC-32 of A + B from crc(A), crc(B) and len(B) (zlib's crc32_combine)."""
    return _nvio.crc32_combine(crc1, crc2, len2)


class CrcPool:
    """Threads that compute CRC-32s (nvio_crc32 releases the GIL). Not a
    concurrent.futures executor: those refuse work once interpreter exit has
    begun, and async saves still finish at exit."""

    def __init__(self, n):
        self.n = n
        self.q = queue.SimpleQueue()
        self.threads = []
        self.lock = threading.Lock()

    def submit(self, fn, *args):
        fut = concurrent.futures.Future()
        with self.lock:
            if len(self.threads) < self.n:
                t = threading.Thread(target=self._run, name="nvio-crc", daemon=True)
                t.start()
                self.threads.append(t)
        self.q.put((fut, fn, args))
        return fut

    def _run(self):
        while True:
            fut, fn, args = self.q.get()
            try:
                res, err = fn(*args), None
            except BaseException as e:  # noqa: BLE001 - it goes to the future
                res, err = None, e
            # the job's arguments go before its caller hears of it: a pool
            # thread never drops the last reference to a caller's storage
            # (freeing device memory here, later, while the next save runs)
            del fn, args
            if err is None:
                fut.set_result(res)
            else:
                fut.set_exception(err)
            del fut, res, err


_pool = None
_pool_lock = threading.Lock()


def executor():
    """The process's CRC pool (made on first use; a forked child makes its own)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = CrcPool(max(1, min(8, os.cpu_count() or 1)))
        return _pool


def _reset_after_fork():
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def crc_submit(regions, chunk=CRC_CHUNK):
    """Start CRC-32s of host memory regions [(address, nbytes)]; returns a
    callable that waits and gives the list of CRCs, in order.

    ``result.settle()`` waits for every batch without raising (error paths
    that did not call it).

    Regions are cut into pieces of at most ``chunk`` bytes and the pieces
    dealt, in order, to one batch per CRC thread with about equal bytes;
    each batch is one ``crc32_many`` call (no Python work per tensor), and
    the pieces of a region are joined with ``crc32_combine``."""
    ex = executor()
    pieces = []                  # (address, nbytes)
    owner = []                   # region index of each piece
    for i, (addr, n) in enumerate(regions):
        for off in range(0, n, chunk) if n else (0,):
            pieces.append((addr + off, min(chunk, n - off)))
            owner.append(i)
    total = sum(p[-1] for p in pieces)
    share = -(-total // ex.n) if total else 1
    batches = []
    start = acc = 0
    for j, p in enumerate(pieces):
        acc += p[-1]
        if acc >= share * (len(batches) + 1) or j == len(pieces) - 1:
            batches.append(pieces[start:j + 1])
            start = j + 1
    futs = [ex.submit(_nvio.crc32_many, b) for b in batches]

    def settle():
        """Wait for every batch, raising nothing: for a caller's error path,
        before it frees the memory they read."""
        concurrent.futures.wait(futs)

    def result():
        settle()                # all end before the first failure is raised
        crcs = [c for f in futs for c in f.result()]
        out = [None] * len(regions)
        for p, i, c in zip(pieces, owner, crcs):
            out[i] = c if out[i] is None else crc32_combine(out[i], c, p[-1])
        return out
    result.settle = settle
    return result


def crc_device(storage, n):
    """CRC-32 of a device storage's first n bytes, from copies of
    DEVICE_CRC_CHUNK bytes at a time into one host buffer (runs on a CRC
    thread: ``executor().submit(crc_device, storage, n)``)."""
    buf = torch.empty(min(n, DEVICE_CRC_CHUNK), dtype=torch.uint8)
    crc = 0
    for off in range(0, n, DEVICE_CRC_CHUNK):
        k = min(DEVICE_CRC_CHUNK, n - off)
        _device.copy_to_host(buf[:k], storage, off)
        crc = _nvio.crc32(buf[:k], crc)
    return crc
