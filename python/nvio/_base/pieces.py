"""Vectored reads and writes of tensor pieces, and host memory for them.

A piece is (buffer, file offset): a uint8 tensor (host or device memory),
a memoryview, a LockedBuffer. ``read_pieces`` and ``write_device`` cut a
list of pieces into the vectored ops libnvio takes (MAX_IOV pieces each;
one device per vector; one op per piece under cuFile). ``alloc_host`` and
``alloc_region`` give host memory that O_DIRECT reads land in without a
copy (page-aligned; locked with ``pin``).
"""
from __future__ import annotations

import mmap as _mmap

import torch

from .. import _device, _nvio
from ..handles import _locked_buffer

#: Storages from this size on get their own page-aligned mapping (so that
#: O_DIRECT reads land in them without a copy); smaller ones come from
#: torch's allocator.
ALIGNED_ALLOC_MIN = 64 << 10


def locked_buffer(nbytes, unlocked_ok=False):
    """A page-aligned, zeroed, page-locked nvio LockedBuffer of nbytes;
    ``unlocked_ok``: unlocked memory where RLIMIT_MEMLOCK refuses (else
    NvioError naming the limit)."""
    return _locked_buffer(nbytes, unlocked_ok)


def read_pieces(f, pieces):
    """Read [(buffer, offset)] (offsets increasing, no overlap) in as few
    vectored ops as nvio takes."""
    step = _nvio.MAX_IOV
    for i in range(0, len(pieces), step):
        f.preadv(pieces[i:i + step], _nvio.OFFSET_PER_IOV)


def write_device(f, pieces):
    """Start writing [(uint8 tensor over device memory, file offset)]
    straight from device memory; their futures. libnvio takes a vector all
    on one device, and cuFile one buffer per op: a GDS handle gets an op
    per piece, any other handle vectored ops per device (its bounce
    buffers)."""
    gds = f.handle.uses_gds()
    groups = {}
    for t, off in pieces:
        if t.numel():
            groups.setdefault(_device.location(t.untyped_storage()), []).append((t, off))
    futs = []
    for group in groups.values():
        if gds:
            futs += [f.pwrite_async(t, off) for t, off in group]
        else:
            step = _nvio.MAX_IOV
            futs += [f.pwritev_async(group[i:i + step], _nvio.OFFSET_PER_IOV)
                     for i in range(0, len(group), step)]
    return futs


def wait_all(futs):
    """Wait for every future (their buffers are busy until then); raise the
    first failure."""
    first = None
    for fut in futs:
        try:
            fut.result()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            if first is None:
                first = e
    if first is not None:
        raise first


def alloc_host(nbytes, pin):
    """An untyped CPU storage of nbytes whose memory suits O_DIRECT."""
    if pin:
        if nbytes == 0:
            return torch.UntypedStorage(0)
        return torch.frombuffer(_locked_buffer(nbytes, False), dtype=torch.uint8).untyped_storage()
    if nbytes < ALIGNED_ALLOC_MIN:
        return torch.UntypedStorage(nbytes)
    return torch.frombuffer(anon(nbytes), dtype=torch.uint8).untyped_storage()


def anon(nbytes):
    """Private anonymous memory, in transparent huge pages where the kernel
    gives them. (mmap.mmap(-1, n) alone is *shared* anonymous memory, which
    gets no huge pages unless shmem_enabled says so: filling it cost 0.85-0.9
    CPU s/GB here, 4 KiB faults of shmem, against 0.12 s/GB for private
    memory in huge pages; 0.59 s/GB private in 4 KiB pages.)"""
    m = _mmap.mmap(-1, nbytes, flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS)
    if nbytes >= 2 << 20 and hasattr(m, "madvise") and hasattr(_mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(_mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return m


def alloc_region(nbytes, pin):
    """Page-aligned host memory for every storage of a checkpoint at once
    (a buffer object; huge pages where the kernel gives them)."""
    if pin:
        return _locked_buffer(nbytes, False)
    return anon(nbytes)
