"""nvio.save: torch.save's format, written at the device's speed, all or nothing.

The file is an ATOMIC nvio file (an unnamed temporary beside the destination
that replaces it at commit: fsync, rename, fsync of the directory). Tensor
bytes go to the file in one vectored op straight from the tensors' memory
(each record's data starts on a page boundary, so the bulk moves with
O_DIRECT), libnvio taking the records' CRC-32 as it moves them; then
one more vectored op writes the headers, descriptors,
small tensors and directory in page-aligned runs that fill the file
between the large tensors' pages (``_base.plan.write_plans``). A checkpoint of
many small host storages (a few hundred KB each) is written instead as its
file image through two windows (:func:`write_packed`): one copy of the
bytes with their CRCs in the same pass, whole-window O_DIRECT writes, no
small write per record. Such a checkpoint is written while it is still
being pickled: its tensor records come first in the file, laid out as the
pickler meets their storages, and each window goes to the file as soon as
it is laid out (``_base.plan.ImageStream``), so the device starts within
~10 ms instead of after the whole pickle and layout (40-60 ms for 5,000
tensors). Anything failing on the way (a bad object, ENOSPC, EIO, Ctrl-C)
leaves the destination as it was and no temporary behind.
"""
from __future__ import annotations

import os

import torch

from .. import _device, _nvio
from .._base.handle import default_handle
from .._base.plan import (DEFAULT_ALIGN, ImageStream, Plan, Restart, gc_paused, packs,
                          write_image, write_plans)
from .._base.space import open_atomic, reserve_space
from ._dist import save_group

__all__ = ["save", "default_handle", "write_plan", "write_plans"]


def write_plan(plan, f):
    """Write a laid-out checkpoint into an open, empty, writable nvio File:
    packed through windows (:func:`write_packed`) when it is many small
    host storages, else straight from the tensors' memory."""
    if _packs(plan):
        write_packed(plan, f)
    else:
        reserve_space(f, plan.size)
        write_plans(f, [(0, plan)])


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
        args = (obj, f, h, durable, spare, align, pickle_protocol)
        if _device.has_provider():      # its memory may look like the host's
            plan = _save_planned(*args)
        else:
            try:
                plan = _save_streamed(*args)
            except Restart:     # a device's storage after the first windows
                plan = _save_planned(*args)
        # freed while the collector is off: it comes back on with nothing of
        # ours to walk (0.06-0.1 s for 50,000 tensors' records, else)
        del plan
    return None


def _save_planned(obj, f, h, durable, spare, align, pickle_protocol):
    """The plan made (the object pickled) before the file is opened, then
    written. Returns the plan."""
    plan = Plan(obj, f, align, pickle_protocol)
    with open_atomic(h, f, durable, spare) as nf:       # an exception abandons it
        write_plan(plan, nf)
        nf.commit()
    return plan


def _save_streamed(obj, f, h, durable, spare, align, pickle_protocol):
    """The file opened first and the plan made with an ImageStream: a
    checkpoint that packs is written window by window while it is still
    being pickled; any other is written once its plan is made. Returns the
    plan."""
    try:            # the checkpoint it replaces: the likely size of this one
        expect = os.stat(f).st_size
    except (OSError, ValueError):
        expect = 0
    with open_atomic(h, f, durable, spare) as nf:       # an exception abandons it
        stream = ImageStream(nf, expect=expect)
        try:
            plan = Plan(obj, f, align, pickle_protocol, grow=stream.grow)
            if not stream.finish(plan):
                write_plan(plan, nf)
        finally:
            stream.close()                  # the writes in flight end first
        nf.commit()
    return plan
