"""nvio.save: torch.save's format, written at the device's speed, all or nothing.

The file is an ATOMIC nvio file (an unnamed temporary beside the destination
that replaces it at commit: fsync, rename, fsync of the directory). Tensor
bytes go to the file in one vectored op straight from the tensors' memory
(each record's data starts on a page boundary, so the bulk moves with
O_DIRECT), libnvio taking the records' CRC-32 as it moves them; then
one more vectored op writes the headers, descriptors,
small tensors and directory in page-aligned runs that fill the file
between the large tensors' pages (:func:`write_plans`). A checkpoint of
many small host storages (a few hundred KB each) is written instead as its
file image through two windows (:func:`write_packed`): one copy of the
bytes with their CRCs in the same pass, whole-window O_DIRECT writes, no
small write per record. Anything failing on the way (a bad object,
ENOSPC, EIO, Ctrl-C) leaves the destination as it was and no temporary
behind.
"""
from __future__ import annotations

import array
import ctypes
import os

import torch

from .. import _device, _nvio
from .._base.crc import crc32_combine, crc_device, executor
from .._base.handle import default_handle
from .._base.pieces import wait_all as _wait_all
from .._base.pieces import write_device
from .._base.plan import DEFAULT_ALIGN, Plan, gc_paused, packs, write_image
from .._base.space import open_atomic, reserve_space
from .._base.views import u8
from ._dist import save_group

__all__ = ["save", "default_handle", "write_plan", "write_plans"]


def write_plan(plan, f):
    """Write a laid-out checkpoint into an open, empty, writable nvio File:
    packed through windows (:func:`write_packed`) when it is many small
    host storages, else straight from the tensors' memory."""
    if _packs(plan):
        write_packed(plan, f)
    else:
        write_plans(f, [(0, plan)], plan.size)


def _packs(plan):
    return packs([plan])


def write_packed(plan, f):
    """Write a checkpoint of many small host storages (``_base.plan.packs``)
    as its file image through windows (``_base.plan.write_image``): one
    copy of the bytes with their CRCs in the same pass buys whole-window
    O_DIRECT writes instead of a direct write, a buffered tail and a
    buffered header per record (thousands of small writes, and as many
    dirty pages to flush)."""
    reserve_space(f, plan.size)
    write_image(plan, f, [s.data_ptr() for _, s in plan.data])


#: A host storage's bytes go to the file straight from its memory when its
#: page-aligned part is at least this long; smaller ones (a 0-dim AdamW
#: step, a norm's weight) and the unaligned ends of larger ones are written
#: with the headers and descriptors around them.
DIRECT_MIN = 64 << 10
#: O_DIRECT writes that never touch the page cache start and end on pages.
PAGE = 4096


def _direct_range(r, s):
    """The part [start, end) of record r's data (storage s) written straight
    from memory: for a host storage its whole pages (or nothing, if fewer
    than DIRECT_MIN bytes), for device memory all of it (the handle stages
    device memory whatever its alignment)."""
    if _device.is_device(s):
        return r.data_offset, r.end
    a = -(-r.data_offset // PAGE) * PAGE
    b = r.end // PAGE * PAGE
    return (a, b) if b - a >= DIRECT_MIN else (r.data_offset, r.data_offset)


def _runs(plan, direct, host):
    """(offset, bytes) of every byte of plan's file that is not written
    straight from memory (``direct``: id(record) -> its direct range), in
    file order, neighbours merged: headers, small records, descriptors, the
    directory, and the bytes of host storages (``host``: id(record) -> its
    uint8 view) outside their direct range. Each run ends where a direct
    range starts and starts where one ends: on pages, so that with O_DIRECT
    the whole file but its last page is written without the page cache and
    without a write per record. Needs every data record's crc."""
    runs = []
    start, parts, pos = 0, [], 0

    def cut(resume):            # the run so far ends; the next starts at resume
        nonlocal start, parts
        if parts:
            runs.append((start, b"".join(parts)))
        start, parts = resume, []

    for r in plan.layout.records:
        if r.header_offset != pos:          # never in nvio's layouts
            cut(r.header_offset)
        parts.append(r.local)
        m = plan.meta.get(r.name)
        if m is not None:
            parts.append(m)
        elif r.size:
            a, b = direct.get(id(r), (r.end, r.end))
            if a > r.data_offset or b < r.end:      # host memory: file offset -> address
                addr = host[id(r)].data_ptr() - r.data_offset
            if a > r.data_offset:
                parts.append(ctypes.string_at(addr + r.data_offset, a - r.data_offset))
            if b > a:
                cut(b)
            if b < r.end:
                parts.append(ctypes.string_at(addr + b, r.end - b))
        parts.append(r.descriptor())
        pos = r.end + r.descriptor_size
    if plan.dir_offset != pos:
        cut(plan.dir_offset)
    parts.append(plan.layout.directory())
    cut(None)
    return runs


def write_plans(f, placed, size):
    """Write laid-out checkpoints [(base offset, Plan)] into an open writable
    nvio File of ``size`` bytes (several torch.save images in one file, as
    DCP stores them): the whole pages of each large tensor in one vectored
    op straight from their memory, libnvio taking each one's CRC-32 as it
    moves it (in the same pass as its bounce copy where the memory is not
    aligned for O_DIRECT: no pass of its own over the tensors), then, once
    those CRCs are known, everything else in runs that fill the file
    between those pages exactly (headers, small records and small tensors,
    the unaligned ends of large ones, descriptors, the directory:
    :func:`_runs`). Every write starts and ends on a page (but the file's
    last), so with O_DIRECT no byte goes through the page cache and no
    record costs a small write of its own.

    Storages in device memory (CUDA) go to the file from device memory,
    through the handle's bounce buffers or cuFile; their CRC-32s come from
    chunked copies to the host (``crc_device``)."""
    host, dev = [], []
    for base, plan in placed:
        for r, s in plan.data:
            if _device.is_device(s):
                dev.append((base, r, s))
            else:           # host memory; another device's (mps, xpu) copied here
                host.append((base, r, s if s.device.type == "cpu" else s.cpu()))
    reserve_space(f, size)
    if dev:
        _device.synchronize([s for _, _, s in dev])   # torch's writes to them ended
    direct, views, pieces = {}, {}, []
    for base, r, s in host:
        if r.size:
            v = views[id(r)] = u8(s)
            a, b = direct[id(r)] = _direct_range(r, s)
            if b > a:
                pieces.append((v[a - r.data_offset:b - r.data_offset], base + a))
    for _, r, _ in dev:
        direct[id(r)] = (r.data_offset, r.end)
    dev_crcs = [executor().submit(crc_device, s, r.size) for _, r, s in dev]
    futs = []
    try:
        if pieces:
            # libnvio takes each piece's CRC-32 as it moves it (in the
            # same pass as its bounce copy of unaligned memory)
            direct_crcs = array.array("I", bytes(4 * len(pieces)))
            futs.append(f.pwritev_async(pieces, _nvio.OFFSET_PER_IOV, crc32=direct_crcs))
        if dev:
            futs += write_device(f, [(u8(s), base + r.data_offset) for base, r, s in dev])
        _host_crcs(host, direct, futs[0] if pieces else None,
                   direct_crcs if pieces else None)
        for (_, r, _), crc in zip(dev, dev_crcs):
            r.crc = crc.result()
        meta = [(b, base + off) for base, plan in placed
                for off, b in _runs(plan, direct, views)]
        futs.append(f.pwritev_async(meta, _nvio.OFFSET_PER_IOV))
    finally:
        _wait_all(futs)                   # also on an error: buffers are busy
    del pieces, host, dev, views


def _host_crcs(host, direct, fut, direct_crcs):
    """Sets the crc of every host record: the bytes outside its direct range
    (a small record whole; a large one's unaligned ends) checksummed here
    while the direct pieces are written, then joined with the direct
    pieces' CRCs, which libnvio gives once that write (``fut``) is done."""
    regions = []
    for _, r, s in host:
        a, b = direct.get(id(r), (r.end, r.end))
        addr = s.data_ptr() - r.data_offset          # file offset -> address
        if b > a:
            regions += [(addr + r.data_offset, a - r.data_offset), (addr + b, r.end - b)]
        else:
            regions.append((addr + r.data_offset, r.size))
    small = iter(_nvio.crc32_many(regions))
    if fut is not None:
        fut.result()
    mid = iter(direct_crcs or ())
    for _, r, _ in host:
        a, b = direct.get(id(r), (r.end, r.end))
        if b > a:
            head, tail = next(small), next(small)
            r.crc = crc32_combine(crc32_combine(head, next(mid), b - a), tail, r.end - b)
        else:
            r.crc = next(small)


def save(obj, f, *, durable=True, handle=None, align=DEFAULT_ALIGN,
         pickle_protocol=2, group=None, writers_per_node=None, timeout=None, spare=False):
    """Save ``obj`` like ``torch.save(obj, f)``, fast and crash-safe.

    ``f``: a path (str, bytes or os.PathLike). The file is torch's zip
    format, read by plain ``torch.load`` (with ``weights_only=True`` where
    torch.save's would be), with every tensor record's data aligned to
    ``align`` bytes (a power of two; the page size by default) so that
    :func:`nvio.load` reads it with O_DIRECT straight into place.

    The new file replaces ``f`` only once complete: written to an unnamed
    temporary beside it, made durable (fsync), renamed over ``f``, and the
    directory fsynced. On any error (a bad object, a full disk, EIO,
    KeyboardInterrupt) ``f`` keeps its old content and no temporary is left.
    ``durable=False`` skips both fsyncs (still all or nothing if the process
    dies, not if the machine does).

    ``handle``: the :class:`nvio.AioHandle` to use (by default one made for
    throughput and shared by nvio's checkpoint functions). A file object
    instead of a path is passed to ``torch.save`` as is.

    ``group`` (a torch.distributed process group whose ranks all hold the
    same state and all call save): a data-parallel save of one file, each
    rank writing an equal share of the tensor bytes (only the first
    ``writers_per_node`` ranks of each host write, if set); the file replaces
    ``f`` only once every rank's share is durable, and a failure on any rank
    fails the save on every rank. ``timeout`` (seconds) bounds the waits for
    other ranks where the backend can tell which rank is missing (gloo).

    ``spare=True`` writes into the blocks of the previous version instead of
    fresh ones (libnvio's FILE_SPARE): the old file is kept beside ``f`` as
    the hidden spare ``.NAME.nvio-spare``, which the next save overwrites
    in place and then swaps with ``f`` (renameat2 RENAME_EXCHANGE after
    the fsync: still all or nothing). On thin-provisioned and loop-backed
    disks that is about twice as fast to write; it costs one more copy of
    the checkpoint on disk for good (``nvio clean --spares DIR`` removes
    spares whose checkpoint is gone), and a reader still holding the old
    version open (a ``torch.load(mmap=True)`` of it) sees it overwritten by
    the save after next. The first save of a new ``f`` writes fresh blocks,
    the second makes the spare, later ones reuse it. With ``group`` the
    ranks write their shares into the spare, which they open by its name.
    """
    if not isinstance(f, (str, bytes, os.PathLike)):
        return torch.save(obj, f, pickle_protocol=pickle_protocol)
    durable = _nvio.check_flag(durable, "durable")
    spare = _nvio.check_flag(spare, "spare")
    if group is not None:
        return save_group(obj, f, group, durable=durable, handle=handle, align=align,
                          pickle_protocol=pickle_protocol,
                          writers_per_node=writers_per_node, timeout=timeout, spare=spare)
    h = handle if handle is not None else default_handle()
    with gc_paused():           # the records' objects start no full collection
        plan = Plan(obj, f, align, pickle_protocol)
        with open_atomic(h, f, durable, spare) as nf:   # an exception abandons it
            write_plan(plan, nf)
            nf.commit()
        # freed while the collector is off: it comes back on with nothing of
        # ours to walk (0.06-0.1 s for 50,000 tensors' records, else)
        del plan
    return None
