"""torch.distributed.checkpoint (DCP) storage through libnvio.

    import torch.distributed.checkpoint as dcp, nvio.dcp
    dcp.save(sd, storage_writer=nvio.dcp.FileSystemWriter("/nvme/step100"))
    dcp.load(sd, storage_reader=nvio.dcp.FileSystemReader("/nvme/step100"))
    fut = dcp.async_save(sd, storage_writer=nvio.dcp.FileSystemWriter(d))

The files are DCP's own: a pickled ``Metadata`` in ``.metadata`` whose
``storage_data`` maps every item to ``_StorageInfo(relative_path, offset,
length)`` in per-rank files ``__{rank}_{n}.distcp``; a tensor item is a
torch.save image of the tensor at that offset, a bytes item its bytes.
DCP's FileSystemReader reads what this writer writes and this reader reads
what DCP's FileSystemWriter writes. What differs is how the bytes move:

- Writing: each image is laid out by nvio's checkpoint planner with the
  tensor's bytes on a page boundary, and each rank file is written as
  nvio.save writes its files (_base.plan): larger tensors with one
  vectored O_DIRECT op straight from their memory, then the runs of
  headers, small tensors and zip directories between them, bytes items in
  one op of their own; a file of many small tensors as its image through
  two windows, each item laid out while the windows before it are
  written. Into an unnamed temporary that is fsynced and renamed into
  place (``sync_files=False``: no fsync). The zip CRC-32s are left 0
  unless ``crc32=True`` (then libnvio takes them as it moves the tensors,
  or the windows' copy does): torch.load does not check them and DCP never
  reads the images otherwise, so computing them would be CPU time the
  format does not need.
- Commit: ``.metadata`` is written last, by the coordinator, after every
  rank's files are durable, and replaces the old one atomically (temporary,
  fsync, rename, fsync of the directory). Data files never overwrite files
  that already exist: in a directory that already holds a checkpoint the new
  files get names of their own (``__{rank}_{n}.{tag}.distcp``), so until the
  new ``.metadata`` lands the old checkpoint stays whole and loadable; after
  it lands, data files it does not use (the old checkpoint's, a failed
  save's) are removed. A save that fails on any rank leaves the previous
  checkpoint (or no ``.metadata`` at all), plus the files that ranks which
  did not fail wrote, until the next save there succeeds.
- Reading: the zip directories and pickles of all requested images are read
  in two vectored ops per file; then one vectored op per file reads every
  requested range straight into the destination tensors where the saved
  chunk and the destination are both contiguous (the common case, also when
  resharding along dim 0), and through a bounded buffer and ``copy_``
  otherwise.
- CUDA tensors: written to the files straight from device memory (the
  handle's bounce buffers, or cuFile on a GdsHandle: one op per storage),
  after torch's current stream; their images record "cpu" as DCP's do. A
  view of part of a storage is aliased (torch's storage over the device
  pointer), a strided one cloned on the device; with ``crc32=True`` the
  CRC-32s come from chunked device-to-host copies. CUDA destinations of a
  load are read into straight (contiguous, same dtype; else through a host
  buffer and torch's copy). DCP's planner hands the tensors over as they
  are (it reads their sizes, never their data). All through nvio/_device.py.
- Untrusted directories: the reader unpickles ``.metadata`` through an
  allowlist, keeps storage paths inside the directory, checks bytes items
  with torch.load(weights_only=True) before DCP's planner unpickles them,
  and refuses FIFOs and devices (FileSystemReader's ``trusted=False``).
- async_save: the writer is its own stager: ``stage`` copies the state dict
  into page-locked memory (one buffer per save in flight, reused by later
  saves), so the write goes with O_DIRECT from locked memory.
"""
from __future__ import annotations

import collections
import concurrent.futures as _cf
import copy as _copy
import datetime
import io
import itertools
import json
import logging
import os
import pickle
import re
import secrets
import stat
import threading
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as _dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import filesystem as _fs
from torch.distributed.checkpoint.api import CheckpointException as _DCPException
from torch.distributed.checkpoint._extension import StreamTransformExtension as _StreamTransform
from torch.distributed.checkpoint.filesystem import SerializationFormat
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import _atomic, _device, _nvio, _regular
from ._base import torchzip as _zip
from ._base.group import Group, GroupFailure, barrier, group_timeout
from ._base.handle import default_handle
from ._base.pieces import locked_buffer, wait_all
from ._base.pickles import check_pickle
from ._base.plan import DEFAULT_ALIGN, CheckpointError, ImageStream, Plan, gc_paused
from ._base.plan import packs_storages, write_plans
from ._base.space import atomic_flags, reserve_space
from ._base.views import tensor_u8 as _u8

__all__ = ["FileSystemWriter", "FileSystemReader", "UnsafeCheckpointError", "save",
           "async_save", "load", "METADATA_MAX_BYTES"]

_log = logging.getLogger(__name__)

_StorageInfo = _fs._StorageInfo
_METADATA = _fs._metadata_fn            # ".metadata"
_SUFFIX = _fs.DEFAULT_SUFFIX            # ".distcp"
#: Names of DCP data files (ours and DCP's): the only files a commit removes.
_DATA_NAME = re.compile(r"^__\d+_\d+(\.[0-9a-f]+)?\.distcp$")
#: With spare=True a data file slot has two names used in turn, DCP's and
#: this one's (tag "b": random tags have 8 hex digits), so that each name
#: finds the spare its last use left: the file two saves back.
_SPARE_TAG = "b"
_ROTATING_NAME = re.compile(r"^__\d+_\d+(\.b)?\.distcp$")
#: Small records of each torch.save image are packed as torch.save packs them.
_META_ALIGN = 64
#: Bytes read from the start and the end of each image to find its pickle,
#: local headers and zip directory (more is read when they do not fit).
_HEAD = 4096
_TAIL = 4096
#: Most bytes of bounce buffers a read holds at once (non-contiguous chunks).
_BOUNCE = 256 << 20


def _handle(handle):
    if handle is not None:
        return handle
    return default_handle()


def _exact(t):
    """t as torch.save should see it: a tensor whose storage holds exactly
    its bytes (DCP clones for this; a contiguous tensor is aliased instead).
    A tensor in device memory stays there (a clone is made on the device);
    another device's (mps, xpu) is copied to the host."""
    t = t.detach()
    dev = _device.is_device(t.untyped_storage())
    if t.device.type != "cpu" and not dev:
        t = t.cpu()
    if t.untyped_storage().nbytes() == t.nbytes:
        return t, None
    if not t.is_contiguous() or t.nbytes == 0:
        return (_device.clone(t) if dev else t.clone()), None
    return _device.alias(t), t          # t: keep alive


class _Image:
    """One item of a rank file: a laid-out torch.save image or raw bytes."""

    def __init__(self, item, base, plan=None, raw=None, keep=None):
        self.item = item
        self.base = base
        self.plan = plan
        self.raw = raw
        self.keep = keep

    @property
    def length(self):
        return self.plan.size if self.plan is not None else len(self.raw)

    def result(self, name):
        """Its WriteResult in rank file ``name``."""
        return WriteResult(index=self.item.index, size_in_bytes=self.length,
                           storage_data=_StorageInfo(name, self.base, self.length))


def _resolved(items, resolve):
    """A rank file's items as it holds them: its bytes items first (packed,
    as DCP's writer puts them), each (item, bytes); then its tensor items,
    each (item, (tensor, keep)) with the tensor made exact (_exact)."""
    raws, tensors = [], []
    for item in items:
        if item.type == WriteItemType.BYTE_IO:
            data = resolve(item)
            raws.append((item, bytes(data.getbuffer()) if isinstance(data, io.BytesIO)
                         else bytes(data)))
    for item in items:
        if item.type != WriteItemType.BYTE_IO:
            tensors.append((item, _exact(resolve(item))))
    return raws, tensors


def _images(raws, tensors, path, align, layouts):
    """The rank file's _Images in file order, each laid out as it is reached
    (a Plan per tensor item; alike ones share a layout: see Plan)."""
    pos = 0
    for item, raw in raws:
        yield _Image(item, pos, raw=raw)
        pos += len(raw)
    for item, (t, keep) in tensors:
        pos = -(-pos // align) * align
        # "cpu", as DCP's writer records (it copies every tensor there)
        plan = Plan(t, path, align, 2, archive="archive", meta_align=_META_ALIGN,
                    location="cpu", layouts=layouts)
        yield _Image(item, pos, plan=plan, keep=(t, keep))
        pos += plan.size


def _layout_file(raws, tensors, path, align, layouts):
    """Lay out one rank file: [_Image] with offsets, and its size."""
    images = list(_images(raws, tensors, path, align, layouts))
    return images, (images[-1].base + images[-1].length if images else 0)


def _packed(tensors):
    """Whether a rank file is written as its image through windows (many
    small host tensors: _base.plan.packs' rule, from the exact tensors)."""
    return packs_storages([t.untyped_storage() for _, (t, _) in tensors])


def _write_streamed(f, name, raws, tensors, path, align, layouts, crc):
    """Write a rank file of many small host tensors as its image through
    windows (_base.plan.ImageStream, as nvio.save streams): the bytes items,
    then each tensor item's image as soon as it is laid out, so that the
    device writes the first windows while later items are laid out. The
    file is allocated once up front on an estimate of its size (a little
    above: each image's headers and directory taken as two pages), the
    excess cut off at the end; no window buffer is larger than that. Its
    WriteResults."""
    expect = sum(len(b) for _, b in raws) + sum(
        2 * align + -(-t.untyped_storage().nbytes() // align) * align for _, (t, _) in tensors)
    stream = ImageStream(f, expect=expect, checksum=crc, most=expect)
    results = []
    try:
        images = _images(raws, tensors, path, align, layouts)
        raw = [next(images) for _ in raws]
        stream.start([(im.base, im.raw) for im in raw if im.raw],
                     raw[-1].base + raw[-1].length if raw else 0)
        for im in itertools.chain(raw, images):
            if im.plan is not None:
                stream.add(im.base, im.plan)
            results.append(im.result(name))
        stream.finish()
    finally:
        stream.close()          # also on an error: its buffers are busy until then
    return results


def _write_direct(f, images, crc):
    """Write a rank file of larger tensors: its bytes items in one op, and
    its torch.save images with their tensors straight from memory
    (_base.plan.write_plans: libnvio takes the CRC-32s as it moves them;
    ``crc`` False: none, the records' crc as DCP leaves it)."""
    raw = [(im.raw, im.base) for im in images if im.raw]
    fut = f.pwritev_async(raw, _nvio.OFFSET_PER_IOV) if raw else None
    try:
        write_plans(f, [(im.base, im.plan) for im in images if im.plan is not None], crc)
    finally:
        if fut is not None:
            wait_all([fut])


#: Bytes of each of a streamed file's two page-aligned buffers.
_SINK_CHUNK = 8 << 20


class _AlignedSink(io.RawIOBase):
    """A write-only stream onto an nvio File: bytes fill one of two page-
    aligned buffers; a full one is written with one op at its offset while
    the other fills (the op before it on that buffer waited for first).
    ``flush`` writes nothing (DCP's transforms flush after every item: a
    partial buffer would break the alignment); ``finish`` writes the rest."""

    def __init__(self, f, bufs):
        super().__init__()
        self.f = f
        self.bufs = [memoryview(b).cast("B") for b in bufs]
        self.futs = [None] * len(bufs)
        self.cur = 0
        self.fill = 0
        self.base = 0           # file offset of the current buffer's first byte
        self.err = None

    def writable(self):
        return True

    def seekable(self):
        return False

    def tell(self):
        return self.base + self.fill

    def write(self, b):
        src = memoryview(b).cast("B")
        n, i = len(src), 0
        while i < n:
            buf = self.bufs[self.cur]
            k = min(n - i, len(buf) - self.fill)
            buf[self.fill:self.fill + k] = src[i:i + k]
            self.fill += k
            i += k
            if self.fill == len(buf):
                self._submit()
        return n

    def _wait(self, j):
        fut, self.futs[j] = self.futs[j], None
        if fut is not None:
            try:
                fut.result()
            except BaseException as e:  # noqa: BLE001 - kept; raised by _submit/finish
                self.err = self.err or e

    def _submit(self):
        if self.fill:
            self.futs[self.cur] = self.f.pwrite_async(self.bufs[self.cur][:self.fill], self.base)
            self.base += self.fill
            self.fill = 0
        self.cur = (self.cur + 1) % len(self.bufs)
        self._wait(self.cur)        # its previous op ended: it can be filled
        if self.err is not None:
            raise self.err

    def finish(self, write=True):
        """Write what is buffered (unless not ``write``: a failed file) and
        wait for every op."""
        try:
            if write and self.fill and self.err is None:
                self.futs[self.cur] = self.f.pwrite_async(self.bufs[self.cur][:self.fill],
                                                          self.base)
                self.base += self.fill
                self.fill = 0
        finally:
            for j in range(len(self.bufs)):
                self._wait(j)
        if self.err is not None:
            raise self.err


def _host_exact(t):
    """A tensor item as DCP's writer saves it: detached, in host memory, its
    storage holding exactly its bytes (cloned when it is a view)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.untyped_storage().nbytes() != t.nbytes:
        t = t.clone()
    return t


def _safetensors_blob(tensors, offsets):
    """The safetensors image DCP's writer appends to a rank file in the
    safetensors layout (same library, same metadata keys)."""
    from safetensors.torch import save as st_save       # optional: only this format needs it
    from torch.distributed.checkpoint import _hf_utils as hf  # torch-private, newer torches only
    return st_save(tensors, metadata={hf.CUSTOM_METADATA_KEY: json.dumps(offsets),
                                      hf.DCP_VERSION_KEY: str(hf.HF_DCP_VERSION),
                                      hf.FORMAT_KEY: hf.FORMAT_VALUE})


def _keep_as_spare(path):
    """Gives a data file nobody uses any more its hidden spare name, where
    the next save of that name finds its blocks (True), unless that name is
    taken or the file system has no hard links (False: remove it). A link
    then an unlink, so that no file at the spare's name is ever replaced."""
    d, base = os.path.split(path)
    try:
        os.link(path, os.path.join(d, "." + base + ".nvio-spare"), follow_symlinks=False)
    except OSError:
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return True


class FileSystemWriter(_fs._FileSystemWriter, BlockingAsyncStager):
    """DCP's FileSystemWriter, writing through libnvio (see the module).

    The arguments are DCP's: ``thread_count`` rank files are written at once
    (one op each; nvio's workers move them in parallel), ``single_file_per_rank
    =False`` gives one file per item, ``sync_files=False`` skips the fsyncs.
    ``per_thread_copy_ahead`` is accepted and unused (nothing is copied).
    ``_extensions`` (stream transforms such as DCP's ``ZStandard``; None or
    empty: none) and ``serialization_format`` (``SerializationFormat`` or
    its value; SAFETENSORS appends DCP's safetensors image of the rank's
    tensors) mean what they mean to DCP, and the files are DCP's byte for
    byte: each item goes through DCP's own transform chain into two
    page-aligned buffers that are written with one op each (O_DIRECT
    straight from them) while the other fills; the files still land
    atomically as below. Such files are written one after another (the
    transforms are the cost; ``thread_count`` still sets the file count).

    nvio's keyword-only additions: ``handle`` (an :class:`nvio.AioHandle`;
    nvio's checkpoint handle by default), ``align`` (tensor bytes' alignment
    in the files, a power of two >= 4096), ``crc32`` (fill in the zip
    CRC-32s, for zip tools; DCP does not need them), ``process_group`` and
    ``timeout`` (seconds): with a group, every rank waits at the end of its
    writes in a ``monitored_barrier`` (gloo) so that a rank that died is
    named in the error instead of surfacing as a lost connection.

    ``spare=True`` (saving again and again into the same directory): each
    data file is written into the blocks of the one its slot had two saves
    back instead of fresh ones (libnvio's FILE_SPARE; on thin or
    loop-backed disks about twice as fast to write). A slot's two names
    (DCP's ``__R_N.distcp`` and ``__R_N.b.distcp``) are used in turn; at
    commit the data files the new checkpoint does not use are renamed to
    their hidden spare names (``.__R_N.distcp.nvio-spare``) instead of being
    removed: the directory holds two checkpoints' worth of data for good.
    Nothing changes for a save into a new directory (there is nothing to
    reuse). ``.metadata`` is written as without it (it is small).
    """

    def __init__(self, path, single_file_per_rank=True, sync_files=True, thread_count=1,
                 per_thread_copy_ahead=10_000_000, cache_staged_state_dict=False,
                 overwrite=True, _extensions=None,
                 serialization_format=SerializationFormat.TORCH_SAVE, *, handle=None,
                 align=DEFAULT_ALIGN, crc32=False, process_group=None, timeout=None,
                 spare=False):
        try:
            fmt = SerializationFormat(serialization_format)
        except ValueError:
            raise ValueError("nvio.dcp: serialization_format must be one of %s, not %r"
                             % ([f.value for f in SerializationFormat],
                                serialization_format)) from None
        if _extensions is not None:
            _extensions = list(_extensions)
            for ex in _extensions:
                if not isinstance(ex, _StreamTransform):
                    raise TypeError("nvio.dcp: _extensions takes StreamTransformExtension "
                                    "objects, not %r" % (ex,))
        _fs._FileSystemWriter.__init__(self, path=path, single_file_per_rank=single_file_per_rank,
                                       sync_files=_nvio.check_flag(sync_files, "sync_files"),
                                       thread_count=thread_count,
                                       per_thread_copy_ahead=per_thread_copy_ahead,
                                       overwrite=overwrite, _extensions=_extensions,
                                       serialization_format=fmt)
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        if thread_count < 1:
            raise ValueError("nvio.dcp: thread_count must be >= 1, not %r" % (thread_count,))
        if align < 4096 or align & (align - 1):
            raise ValueError("nvio.dcp: align must be a power of two >= 4096, not %r" % (align,))
        self.handle = handle
        self.align = align
        self.crc32 = _nvio.check_flag(crc32, "crc32")
        self.process_group = process_group
        self.timeout = timeout
        self.spare = _nvio.check_flag(spare, "spare")
        self._tag = None
        self._pool = _StagingPool()
        self.failure = None     # the error naming a rank that did not finish


    def reset(self, checkpoint_id=None):
        super().reset(checkpoint_id)
        self._tag = None
        self.failure = None

    # -- writing ----------------------------------------------------------------

    def _file_name(self, prefix, n):
        """DCP's name, or one of our own when that name is taken (by the
        checkpoint this save replaces, which must stay whole until commit):
        with spare, the slot's other name if free, else a random one."""
        name = "%s%d%s" % (prefix, n, _SUFFIX)
        if os.path.lexists(os.path.join(self.path, name)):
            alt = "%s%d.%s%s" % (prefix, n, _SPARE_TAG, _SUFFIX)
            if self.spare and not os.path.lexists(os.path.join(self.path, alt)):
                return alt
            # a tag of this writer's may name a file of the live checkpoint
            # (a reused writer: DCP resets it only with a checkpoint_id)
            while True:
                if self._tag is None:
                    self._tag = secrets.token_hex(4)
                name = "%s%d.%s%s" % (prefix, n, self._tag, _SUFFIX)
                if not os.path.lexists(os.path.join(self.path, name)):
                    break
                self._tag = None
        return name

    def write_data(self, plan, planner):
        prefix = plan.storage_data.prefix
        if self.single_file_per_rank:
            buckets = _fs._split_by_size_and_type(self.thread_count, plan.items)
        else:
            buckets = [[item] for item in plan.items]
        buckets = [b for b in buckets if b] or [[]]
        try:
            # no cyclic collection while thousands of images are laid out and
            # written (their records would be walked at every one: 0.25-0.5 s
            # of a 1.7 s save of 5,000 tensors); they are freed before it
            # comes back on
            with gc_paused():
                results = self._write_files(prefix, buckets, planner)
        except BaseException:
            # the others wait in the barrier: meet them, then fail (DCP then
            # reports every rank's error on every rank)
            self._barrier("writing the data files", quiet=True)
            raise
        finally:
            self._pool.release_oldest()   # a staged snapshot is on disk (or failed)
        self._barrier("writing the data files")
        fut = Future()
        fut.set_result(results)
        return fut

    def _write_files(self, prefix, buckets, planner):
        """Write and commit the data files, FILES_AT_ONCE open at a time (a
        file per item can mean thousands: the descriptor limit). Files
        committed before a failure are referenced by no metadata; the next
        save's finish removes them."""
        results = []
        for first in range(0, len(buckets), FILES_AT_ONCE):
            results += self._write_some(prefix, first, buckets[first:first + FILES_AT_ONCE],
                                        planner)
        return results

    def _write_some(self, prefix, first, some, planner):
        h = _handle(self.handle)
        flags = atomic_flags(self.sync_files, self.spare)
        files, results = [], []
        bufs = None
        layouts = {}
        try:
            for n, items in enumerate(some, first):
                name = self._file_name(prefix, n)
                path = os.path.join(self.path, name)
                if self._streamed():
                    f = h.open(path, flags)
                    files.append((f, None))
                    if bufs is None:
                        bufs = [_nvio.LockedBuffer(_SINK_CHUNK) for _ in range(2)]
                    results += self._stream_file(f, name, items, planner, bufs)
                    continue
                raws, tensors = _resolved(items, planner.resolve_data)
                if _packed(tensors):    # laid out and written window by window
                    f = h.open(path, flags)
                    files.append((f, None))
                    results += _write_streamed(f, name, raws, tensors, path, self.align,
                                               layouts, self.crc32)
                    continue
                images, size = _layout_file(raws, tensors, path, self.align, layouts)
                f = h.open(path, flags)
                files.append((f, images))
                reserve_space(f, size)     # ENOSPC before any byte moves
                results += [im.result(name) for im in images]
            for f, images in files:     # each waits for its own ops, also on an error
                if images:      # (None: streamed, written already)
                    _write_direct(f, images, self.crc32)
            for f, _ in files:
                f.commit()              # fsync, rename into place, fsync the directory
        finally:
            for f, _ in files:
                f.close()               # an uncommitted one is abandoned: no trace
        return results

    def _streamed(self):
        """Whether items go through DCP's stream path: with stream
        extensions, or in the safetensors layout."""
        return bool(self.transforms.extensions) or \
            self.serialization_format != SerializationFormat.TORCH_SAVE

    def _stream_file(self, f, name, items, planner, bufs):
        """Write one rank file as DCP's writer writes it with ``_extensions``
        or ``serialization_format``: each item (bytes items first) through
        DCP's own per-item transform chain, into page-aligned buffers that
        go to the file with one op each (O_DIRECT straight from them) while
        the next fills. Transformed bytes have no tensor to be written from;
        the file's bytes are DCP's, byte for byte. Its WriteResults."""
        fmt = self.serialization_format
        sink = _AlignedSink(f, bufs)
        results, tensors, offsets = [], {}, {}
        ok = False
        try:
            ordered = [i for i in items if i.type == WriteItemType.BYTE_IO] + \
                      [i for i in items if i.type != WriteItemType.BYTE_IO]
            for item in ordered:
                data = planner.resolve_data(item)
                if item.type != WriteItemType.BYTE_IO:
                    data = _host_exact(data)
                    tensors[item.index.fqn] = data
                    offsets[item.index.fqn] = {"saved_offsets": item.tensor_data.chunk.offsets}
                results.append(_fs._write_item(self.transforms, sink, data, item, name, fmt))
            if fmt == SerializationFormat.SAFETENSORS:
                sink.write(_safetensors_blob(tensors, offsets))
            ok = True
        finally:
            sink.finish(write=ok)   # waits for every op; raises the first error
        return results

    def _barrier(self, what, quiet=False):
        g = self.process_group
        if g is None or not dist.is_initialized() or dist.get_world_size(g) < 2:
            return
        if dist.get_backend(g) != "gloo":
            return
        t = self.timeout
        if t is None:
            t = group_timeout(g)
        elif not isinstance(t, datetime.timedelta):
            t = datetime.timedelta(seconds=t)
        try:
            barrier(g, t, what)     # names the dead, from the group's store
        except RuntimeError as e:
            if quiet:
                return
            err = CheckpointError("nvio.dcp: %s: %s: not every rank finished (rank %d "
                                  "waited): %s; the previous checkpoint (if any) is unchanged"
                                  % (self.path, what, dist.get_rank(g), e), str(self.path))
            # DCP's next collective fails too (a rank is gone) and its error,
            # the transport's, is what dcp.save raises: say who is missing
            # here, and keep it for nvio.dcp.save to raise
            _log.error("%s", err)
            self.failure = err
            raise err from None

    def finish(self, metadata: Metadata, results) -> None:
        metadata.version = _fs.CURRENT_DCP_VERSION
        storage_md = {}
        for wr_list in results:
            storage_md.update({wr.index: wr.storage_data for wr in wr_list})
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        rank = self.rank if (not self.use_collectives and self.rank is not None) else None
        mpath = os.fspath(self._get_metadata_path(rank))
        # no cyclic collection while the metadata is pickled: its thousands
        # of temporary tuples start full ones, each walking every object of
        # the process (5,000 items: 0.06 s to pickle, 0.26-0.29 s with them)
        with gc_paused():
            blob = pickle.dumps(metadata)
        flags = _nvio.FILE_ATOMIC | (0 if self.sync_files else _nvio.FILE_NOSYNC)
        with _handle(self.handle).open(mpath, flags) as f:
            if blob:
                f.pwrite(blob, 0)
            f.commit()                  # the checkpoint exists from here on
        if self.sync_files:
            # the checkpoint's directory may be new (DCP made it): its entry
            # must be as durable as its files
            _atomic.fsync_dir(os.path.dirname(os.path.abspath(os.fspath(self.path))))
        # the directory is this checkpoint's: data files it does not use are
        # the replaced checkpoint's, or a failed save's
        keep = {s.relative_path for s in storage_md.values()}
        mine = "__" if rank is None else "__%d_" % rank
        for name in sorted(os.listdir(self.path)):
            if name not in keep and name.startswith(mine) and _DATA_NAME.match(name):
                path = os.path.join(self.path, name)
                if self.spare and _ROTATING_NAME.match(name) and _keep_as_spare(path):
                    continue
                try:
                    _atomic.remove(path)    # its blocks freed in the background
                except FileNotFoundError:
                    pass

    # -- async_save staging ----------------------------------------------------

    def stage(self, state_dict):
        """Copy ``state_dict`` into page-locked memory (async_save calls this);
        the copy is freed for reuse once its write_data has ended. Staged
        copies are released in order by this writer's write_data calls (DCP
        runs async saves one after another): do not use the same writer
        object for a plain dcp.save while an async save it staged is
        pending. A state holding tensors of other kinds (a ShardedTensor of
        FSDP1's sharded state dicts, a tensor subclass) is staged by DCP's
        own stager."""
        if _foreign_tensors(state_dict):
            snap = BlockingAsyncStager.stage(self, state_dict)
            self._pool.hold(None)       # write_data releases one staged save
            return snap
        return self._pool.stage(state_dict)

    def close(self):
        self._pool.clear()

    def __getstate__(self):
        # async_save with a process executor sends the writer to another
        # process: the staging pool (a lock, locked memory) and the handle
        # stay here; it makes its own
        d = self.__dict__.copy()
        d["_pool"] = None
        d["handle"] = None
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._pool = _StagingPool()


#: Data files a writer or reader holds open at a time.
FILES_AT_ONCE = 64

_IMMUTABLE = frozenset((str, bytes, int, float, complex, bool, type(None), torch.dtype,
                        torch.device, torch.Size))
_warned_unlocked = []


def _warn_unlocked(e):
    if not _warned_unlocked:
        _warned_unlocked.append(True)
        _log.warning("nvio.dcp: async_save stages into memory that is not page-locked: %s", e)


class _StagingPool:
    """Page-locked snapshot buffers: one per save between stage() and the
    end of its write_data (DCP runs async saves one after another)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.free = []
        self.busy = collections.deque()

    def _take(self, n):
        with self.lock:
            fits = [b for b in self.free if len(b) >= n]
            if fits:
                b = min(fits, key=len)
                self.free.remove(b)
            else:
                b = None
        if b is None:
            try:
                b = locked_buffer(max(n, 4096), False)
            except OSError as e:
                # O_DIRECT needs aligned memory, not locked memory: past
                # RLIMIT_MEMLOCK, page-aligned memory that is not locked
                _warn_unlocked(e)
                b = locked_buffer(max(n, 4096), True)
        self.hold(b)
        return b

    def hold(self, buf):
        """buf (None: a save staged elsewhere) is in use until the
        release_oldest of its write_data."""
        with self.lock:
            self.busy.append(buf)

    def release_oldest(self):
        with self.lock:
            if self.busy:
                b = self.busy.popleft()
                if b is not None:
                    self.free.append(b)

    def clear(self):
        with self.lock:
            self.free.clear()

    def stage(self, state_dict):
        leaves = []

        def collect(x):
            if isinstance(x, torch.Tensor):
                leaves.append(_local(x))
            elif isinstance(x, dict):
                for v in x.values():
                    collect(v)
            elif isinstance(x, (list, tuple)):
                for v in x:
                    collect(v)
        collect(state_dict)
        offs, pos = {}, 0
        for t in leaves:
            if id(t) not in offs:
                offs[id(t)] = pos
                pos += -(-t.nbytes // 4096) * 4096
        buf = self._take(pos)
        flat = torch.frombuffer(buf, dtype=torch.uint8, count=max(pos, 1))
        copies = {}

        def copy(t):
            loc = _local(t)
            c = copies.get(id(loc))
            if c is None:
                o = offs[id(loc)]
                c = flat[o:o + loc.nbytes].view(loc.dtype).view(loc.shape) \
                    if loc.nbytes else torch.empty(loc.shape, dtype=loc.dtype)
                st = loc.untyped_storage()
                if loc.nbytes and _device.is_device(st):
                    # device memory: one device-to-host copy; a storage that
                    # holds just this tensor is copied whole, strides kept
                    es = loc.element_size()
                    if st.nbytes() == loc.nbytes:
                        c = flat[o:o + loc.nbytes].view(loc.dtype).as_strided(
                            loc.shape, loc.stride(), o // es + loc.storage_offset())
                        _device.copy_to_host(flat[o:o + loc.nbytes], st, 0)
                    else:
                        src = loc.detach() if loc.is_contiguous() else _device.clone(loc.detach())
                        _device.copy_to_host(flat[o:o + loc.nbytes], src.untyped_storage(),
                                             src.storage_offset() * es)
                else:
                    c.copy_(loc.detach())
                copies[id(loc)] = c
            if _is_dtensor(t):
                from torch.distributed.tensor import DTensor  # torch >= 2.4 (see _is_dtensor)
                return DTensor.from_local(c, t.device_mesh, t.placements, run_check=False,
                                          shape=t.shape, stride=t.stride())
            return c

        def walk(x):
            if isinstance(x, torch.Tensor):
                return copy(x)
            if isinstance(x, dict):
                out = _copy.copy(x)      # its type and attributes (a defaultdict's factory)
                for k, v in x.items():
                    out[k] = walk(v)
                return out
            if isinstance(x, list):
                return [walk(v) for v in x]
            if isinstance(x, tuple):
                return tuple(walk(v) for v in x)
            if type(x) in _IMMUTABLE:
                return x
            # written after async_save returned: a snapshot, as DCP's stager
            # takes (a numpy array, a bytearray, an RNG state)
            return _copy.deepcopy(x)
        try:
            return walk(state_dict)
        except BaseException:
            with self.lock:
                self.busy.remove(buf)
                self.free.append(buf)
            raise


def _is_dtensor(t):
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(t, DTensor)


def _local(t):
    return t._local_tensor if _is_dtensor(t) else t


def _foreign_tensors(x):
    """Whether a state holds tensors the staging pool does not copy: other
    than plain tensors, parameters and DTensors."""
    if isinstance(x, torch.Tensor):
        return type(x) not in (torch.Tensor, torch.nn.Parameter) and not _is_dtensor(x)
    if isinstance(x, dict):
        return any(_foreign_tensors(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_foreign_tensors(v) for v in x)
    return False


# --- what a reader trusts --------------------------------------------------------

#: Most bytes of a ``.metadata`` file a reader takes; a bigger one is refused
#: before it is read (DCP's metadata is some hundred bytes per item).
METADATA_MAX_BYTES = 1 << 30


class UnsafeCheckpointError(CheckpointError):
    """A DCP checkpoint refused as unsafe: its ``.metadata`` holds a class or
    a pickle opcode that DCP's metadata never needs, or names a data file
    outside the checkpoint's directory. ``FileSystemReader(path,
    trusted=True)`` reads such a directory as torch's reader does."""


_MD = "torch.distributed.checkpoint.metadata"
#: The globals in the ``.metadata`` files torch 2.13's writers make (found
#: by saving plain, nested, bytes, DTensor, ShardedTensor, optimizer,
#: no_dist, rank-local, async and extension checkpoints, with str and Path
#: checkpoint ids), and the dtypes, layouts and memory formats by name.
_SAFE_GLOBALS = frozenset(
    [(_MD, n) for n in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING",
                        "StorageMeta", "MetadataIndex")]
    + [("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
       ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
       ("pathlib", "PurePosixPath"), ("collections", "OrderedDict")]
    + [("torch", n) for n, v in vars(torch).items()
       if isinstance(v, (torch.dtype, torch.layout, torch.memory_format))])


def _check_pickle(data, where):
    """A .metadata pickle checked before it is unpickled (nvio._base.pickles)."""
    check_pickle(data, where, UnsafeCheckpointError, "nvio.dcp", "DCP's metadata",
                 "FileSystemReader(..., trusted=True) loads it as torch's reader does")


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata: globals from _SAFE_GLOBALS and the reader's
    ``safe_globals`` only (the opcodes were checked before)."""

    def __init__(self, f, where, extra):
        super().__init__(f)
        self._where = where
        self._extra = extra

    def find_class(self, module, name):
        obj = self._extra.get((module, name))
        if obj is not None:
            return obj
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            "nvio.dcp: %s: the metadata names %s.%s, which is not a DCP metadata class: "
            "refused (pass it in FileSystemReader(..., safe_globals=[...]), or trusted=True)"
            % (self._where, module, name), self._where)


def _check_metadata(md, where):
    """Every field a reader uses has the type DCP gives it."""
    def bad(what):
        return CheckpointError("nvio.dcp: %s: %s: the file is corrupt" % (where, what), where)
    if not isinstance(md, Metadata):
        raise bad("it holds a %s, not DCP Metadata" % type(md).__name__)
    if not isinstance(md.state_dict_metadata, dict):
        raise bad("state_dict_metadata is a %s" % type(md.state_dict_metadata).__name__)
    sd = md.storage_data
    if sd is None:
        return
    if not isinstance(sd, dict):
        raise bad("storage_data is a %s" % type(sd).__name__)
    for idx, info in sd.items():
        if not isinstance(info, _StorageInfo):
            raise bad("item %r is stored as a %s" % (idx, type(info).__name__))
        if not isinstance(info.relative_path, str) or \
                type(info.offset) is not int or type(info.length) is not int or \
                info.offset < 0 or info.length < 0:
            raise bad("item %r is stored at %r, offset %r, length %r"
                      % (idx, info.relative_path, info.offset, info.length))
        td = getattr(info, "transform_descriptors", None)
        if td is not None and (not isinstance(td, (list, tuple)) or
                               not all(isinstance(x, str) for x in td)):
            raise bad("item %r has transform descriptors %r" % (idx, td))


def _escapes(name):
    """Why a storage path leads out of the checkpoint directory by its
    spelling (absolute, ``..``, NUL), or None."""
    if not name:
        return "is empty"
    if "\0" in name:
        return "holds a NUL byte"
    if os.path.isabs(name):
        return "is absolute"
    if ".." in name.split("/"):
        return "climbs out with '..'"
    return None


# --- reading ---------------------------------------------------------------


class _Saved:
    """A torch.save image of one tensor inside a rank file: the tensor as a
    meta tensor (dtype, shape, strides, storage offset) and the file offset
    of its storage's bytes."""

    def __init__(self, tensor, data_offset):
        self.tensor = tensor
        self.data_offset = data_offset


class _MetaUnpickler:
    """persistent_load that makes meta storages and remembers their records."""

    def __init__(self):
        self.keys = {}

    def __call__(self, saved_id):
        if not isinstance(saved_id, tuple) or len(saved_id) != 5:
            raise pickle.UnpicklingError("persistent id %r is no storage record" % (saved_id,))
        typename, stype, key, _location, numel = saved_id
        if isinstance(typename, bytes):
            typename = typename.decode("ascii")
        if typename != "storage":
            raise pickle.UnpicklingError("unknown persistent id type %r" % (typename,))
        dtype = torch.uint8 if stype is torch.UntypedStorage else getattr(stype, "dtype", None)
        if not isinstance(dtype, torch.dtype) or type(numel) is not int or numel < 0:
            raise pickle.UnpicklingError("storage record %r: %r is no storage type, or %r no "
                                         "element count" % (key, stype, numel))
        key = str(key)
        if key not in self.keys:
            nbytes = numel * torch._utils._element_size(dtype)
            s = torch.UntypedStorage(nbytes, device="meta")
            self.keys[key] = (torch.storage.TypedStorage(wrap_storage=s, dtype=dtype,
                                                         _internal=True), nbytes)
        return self.keys[key][0]


class FileSystemReader(_fs.FileSystemReader):
    """DCP's FileSystemReader, reading through libnvio (see the module).

    The arguments are DCP's: ``_extension_registry`` resolves the stream
    transforms (ZStandard, ...) that items written with ``_extensions``
    name. nvio's keyword-only additions:

    - ``handle``: the :class:`nvio.AioHandle` to read with.
    - ``trusted`` (default False): whether this directory is trusted. An
      untrusted one (the default) is read as untrusted input: ``.metadata``
      is unpickled by an allowlist (DCP's metadata classes, ``torch.Size``,
      dtypes, layouts, memory formats, ``pathlib`` paths and the pickle
      opcodes plain values need: a pickle that would run code is refused
      with :class:`UnsafeCheckpointError` before anything runs), and a data
      file must lie inside the directory (an absolute path, ``..`` or a
      symbolic link resolving outside it is refused), and a bytes item is
      handed to the planner (DCP's default one unpickles it with
      ``weights_only=False``) only if ``torch.load(weights_only=True)``
      takes it. ``trusted=True`` reads as torch's reader does: plain
      ``pickle.load``, any path, any bytes item. Use it only for
      directories no one else can write.
    - ``safe_globals``: classes or functions (a custom planner's
      ``planner_data``) to admit in ``.metadata`` besides the allowlist.

    Either way, ``.metadata`` or a data file that is not a regular file (a
    FIFO, a device) is an error naming it and its type, never a hang, and a
    ``.metadata`` over :data:`METADATA_MAX_BYTES` is refused.
    """

    def __init__(self, path, _extension_registry=None, *, handle=None, trusted=False,
                 safe_globals=()):
        super().__init__(path, _extension_registry)
        self.handle = handle
        self.trusted = _nvio.check_flag(trusted, "trusted")
        self.safe_globals = {(o.__module__, o.__qualname__): o for o in safe_globals}

    def _err(self, msg, cls=CheckpointError):
        return cls("nvio.dcp: %s: %s" % (self.path, msg), str(self.path))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = os.fspath(self._get_metadata_path(kwargs.get("rank")))
        name = os.path.basename(path)
        try:
            data = _regular.read_small(path, METADATA_MAX_BYTES, self._err,
                                       limit_name="METADATA_MAX_BYTES")
        except FileNotFoundError:
            raise self._err("no %s file: not a DCP checkpoint directory, or its save "
                            "never completed" % name) from None
        except OSError as e:
            raise self._err("cannot read %s: %s" % (path, e)) from None
        try:
            if self.trusted:
                md = pickle.loads(data)
            else:
                _check_pickle(data, path)
                md = _MetadataUnpickler(io.BytesIO(data), path, self.safe_globals).load()
        except CheckpointError:
            raise
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError,
                IndexError, KeyError, ImportError) as e:
            raise self._err("%s is corrupt or truncated: %s" % (name, e)) from None
        _check_metadata(md, path)
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        # other ranks get the metadata from the coordinator: checked here too
        _check_metadata(metadata, os.fspath(self._get_metadata_path(kwargs.get("rank"))))
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

    def _data_path(self, name, reqs):
        """The path of data file ``name`` (a storage entry's relative_path),
        checked: inside the directory unless trusted, and a regular file."""
        if not self.trusted:
            why = _escapes(name)
            if why is not None:
                raise self._err("the metadata stores items in %r, which %s: refused "
                                "(trusted=True reads it)" % (name, why), UnsafeCheckpointError)
        path = os.path.join(self.path, name)
        if not self.trusted:
            root = os.path.realpath(self.path)
            real = os.path.realpath(path)
            if os.path.commonpath([root, real]) != root:
                raise self._err("data file %s resolves to %s, outside the checkpoint "
                                "directory: refused (trusted=True reads it)" % (name, real),
                                UnsafeCheckpointError)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            fqns = sorted({r.storage_index.fqn for r, _ in reqs})
            raise self._err("data file %s is missing (it holds %d requested item(s), "
                            "e.g. %r): the checkpoint is incomplete"
                            % (name, len(reqs), fqns[0])) from None
        except OSError as e:
            raise self._err("data file %s: %s" % (path, e)) from None
        if not stat.S_ISREG(st.st_mode):
            raise self._err("data file %s is %s, not a regular file"
                            % (path, _regular.kind(st.st_mode)))
        return path

    def read_data(self, plan, planner):
        infos = [self.storage_data[r.storage_index] for r in plan.items]
        per_file = {}
        for req, info in zip(plan.items, infos):
            per_file.setdefault(info.relative_path, []).append((req, info))
        paths = {name: self._data_path(name, reqs) for name, reqs in per_file.items()}
        h = _handle(self.handle)
        names = list(per_file)
        for first in range(0, len(names), FILES_AT_ONCE):   # the descriptor limit
            some = {name: per_file[name] for name in names[first:first + FILES_AT_ONCE]}
            files = {}
            try:
                for name in some:
                    files[name] = h.open(paths[name], _nvio.FILE_READ)
                self._read(files, some, planner)
            finally:
                for f in files.values():
                    f.close()
        fut = Future()
        fut.set_result(None)
        return fut

    def _read(self, files, per_file, planner):
        # 0. items written through stream transforms (_extensions)
        plain = {}
        for name, reqs in per_file.items():
            for req, info in reqs:
                if getattr(info, "transform_descriptors", None):
                    self._read_transformed(files[name], name, req, info, planner)
                else:
                    plain.setdefault(name, []).append((req, info))
        per_file = plain
        # 1. every requested image's pickle and data offset
        saved = {}
        for name, reqs in per_file.items():
            spans = sorted({(i.offset, i.length) for r, i in reqs
                            if r.type != LoadItemType.BYTE_IO})
            saved.update(self._index(name, files[name], spans))
        # 2. the data: straight into the destinations, or through buffers
        jobs = []       # (file name, ReadItem, _StorageInfo)
        for name, reqs in per_file.items():
            for req, info in reqs:
                jobs.append((name, req, info))
        batch, held = [], 0
        for name, req, info in jobs:
            need = self._bounce_need(saved, name, req, info)
            if batch and held + need > _BOUNCE:
                self._run_batch(files, saved, batch, planner)
                batch, held = [], 0
            batch.append((name, req, info))
            held += need
        if batch:
            self._run_batch(files, saved, batch, planner)

    def _load_bytes(self, planner, req, data, name, info):
        """Hand a bytes item to the planner. DCP's default planner unpickles
        it with ``torch.load(weights_only=False)``: from an untrusted
        directory it must first pass ``torch.load(weights_only=True)``."""
        if not self.trusted:
            try:
                torch.load(io.BytesIO(data), weights_only=True)
            except Exception as e:  # noqa: BLE001 - whatever torch's safe mode refuses
                raise self._err("item %s (%s, offset %d, %d bytes) holds a pickle that "
                                "torch.load(weights_only=True) refuses: %s; refused (a "
                                "checkpoint of your own objects: trusted=True)"
                                % (req.storage_index.fqn, name, info.offset, info.length,
                                   str(e).splitlines()[0] if str(e) else type(e).__name__),
                                UnsafeCheckpointError) from None
        planner.load_bytes(req, io.BytesIO(data))

    def _read_transformed(self, f, name, req, info, planner):
        """One item written through stream transforms: its stored bytes read
        with one op, undone by the extensions its descriptors name (from
        the ``_extension_registry``), then loaded as DCP's reader loads it
        (a tensor item with torch.load(weights_only=True))."""
        if info.offset + info.length > f.size:
            raise self._err("%s: item at offset %d (%d bytes) lies past the end of the file "
                            "(%d bytes): the file is truncated"
                            % (name, info.offset, info.length, f.size))
        raw = bytearray(info.length)
        if info.length:
            f.pread(raw, info.offset)
        try:
            src = self.transforms.transform_load_stream(req, info.transform_descriptors,
                                                        io.BytesIO(raw))
            if req.type == LoadItemType.BYTE_IO:
                self._load_bytes(planner, req, src.read(-1), name, info)
                return
            if not src.seekable():
                src = io.BytesIO(src.read(-1))
            t = torch.load(src, map_location="cpu", weights_only=True)
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - a transform's or torch.load's error
            raise self._err("%s: the item at offset %d (%d bytes), transformed by %s, cannot "
                            "be read: %s: %s" % (name, info.offset, info.length,
                                                 list(info.transform_descriptors),
                                                 type(e).__name__, e)) from e
        if not isinstance(t, torch.Tensor):
            raise self._err("%s: the item at offset %d holds %s, not a tensor"
                            % (name, info.offset, type(t).__name__))
        t = narrow_tensor_by_index(t, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != t.size():
            raise self._err("item %s: the saved chunk narrows to %s but the destination is %s"
                            % (req.storage_index, tuple(t.size()), tuple(target.size())))
        target.copy_(t)
        planner.commit_tensor(req, target)

    def _where(self, saved, name, req, info):
        """(view of the saved tensor the request wants, file offset of its
        storage's first byte)."""
        s = saved[(name, info.offset, info.length)]
        v = narrow_tensor_by_index(s.tensor, req.storage_offsets, req.lengths)
        return v, info.offset + s.data_offset

    def _bounce_need(self, saved, name, req, info):
        if req.type == LoadItemType.BYTE_IO:
            return info.length
        v, _ = self._where(saved, name, req, info)
        return 0 if v.is_contiguous() else _span(v)[1]

    def _run_batch(self, files, saved, batch, planner):
        pieces = {}         # file name -> [(buffer, offset)]
        dev = {}            # file name -> [(uint8 tensor over device memory, offset)]
        after = []          # callables run once the data is in
        for name, req, info in batch:
            vec = pieces.setdefault(name, [])
            if req.type == LoadItemType.BYTE_IO:
                b = bytearray(info.length)
                if info.length:
                    vec.append((b, info.offset))
                after.append(lambda req=req, b=b, info=info, name=name:
                             self._load_bytes(planner, req, bytes(b), name, info))
                continue
            v, base = self._where(saved, name, req, info)
            target = planner.resolve_tensor(req).detach()
            on_dev = target.numel() > 0 and _device.is_device(target.untyped_storage())
            if target.size() != v.size():
                raise self._err("item %s: the saved chunk narrows to %s but the destination "
                                "is %s" % (req.storage_index, tuple(v.size()),
                                           tuple(target.size())))
            es = v.element_size()
            if v.numel() == 0:
                after.append(lambda req=req, t=target: planner.commit_tensor(req, t))
            elif v.is_contiguous() and target.is_contiguous() and target.dtype == v.dtype \
                    and (target.device.type == "cpu" or on_dev):
                piece = (_u8(target), base + v.storage_offset() * es)
                (dev.setdefault(name, []) if on_dev else vec).append(piece)
                after.append(lambda req=req, t=target: planner.commit_tensor(req, t))
            else:
                lo, n = _span(v)
                buf = torch.empty(n // es, dtype=v.dtype)
                vec.append((_u8(buf), base + lo))

                def fill(req=req, t=target, buf=buf, v=v, lo=lo, es=es, on_dev=on_dev):
                    src = buf.as_strided(v.size(), v.stride(), v.storage_offset() - lo // es)
                    if on_dev:
                        _device.copy_into(t, src)
                    else:
                        t.copy_(src)
                    planner.commit_tensor(req, t)
                after.append(fill)
        if dev:     # torch's work queued on the destinations ends first
            _device.synchronize([t.untyped_storage() for v in dev.values() for t, _ in v])
        futs = []
        for name, vec in pieces.items():
            for part in _disjoint(vec):
                futs.append((name, files[name].preadv_async(part, _nvio.OFFSET_PER_IOV)))
        for name, vec in dev.items():
            futs += [(name, fut) for fut in _read_device(files[name], vec)]
        err = None
        for name, fut in futs:
            try:
                fut.result()
            except BaseException as e:  # noqa: BLE001 - every op ends first
                err = err or e
        if err is not None:
            raise err
        for fn in after:
            fn()

    def _index(self, name, f, spans):
        """{(name, offset, length): _Saved} for the images at ``spans`` of one
        file, from one vectored read of their heads and tails (more reads
        only where a pickle or directory does not fit in those)."""
        size = f.size
        for off, length in spans:
            if off < 0 or length < 0 or off + length > size:
                raise self._err("%s: item at offset %d (%d bytes) lies past the end of the "
                                "file (%d bytes): the file is truncated" % (name, off, length, size))
        bufs, vec = [], []
        for off, length in spans:
            if length <= _HEAD + _TAIL:
                b = bytearray(length)
                bufs.append((b, None))
                vec.append((b, off))
            else:
                hb, tb = bytearray(_HEAD), bytearray(_TAIL)
                bufs.append((hb, tb))
                vec += [(hb, off), (tb, off + length - _TAIL)]
        vec = [p for p in vec if len(p[0])]
        if vec:
            f.preadv(vec, _nvio.OFFSET_PER_IOV)
        out = {}
        for (off, length), (hb, tb) in zip(spans, bufs):
            img = _ImageBytes(f, off, length, hb, tb)
            try:
                out[(name, off, length)] = self._parse(img)
            except (_zip.ZipFormatError, pickle.UnpicklingError, ValueError, KeyError,
                    TypeError, EOFError, AttributeError, IndexError, RuntimeError) as e:
                raise self._err("%s: the item at offset %d (%d bytes) is no torch.save image "
                                "of a tensor: %s" % (name, off, length, e)) from None
        return out

    def _parse(self, img):
        tail = img.tail if img.tail is not None else img.head
        try:
            cd_off, cd_size, count = _zip.find_directory(tail, img.length - len(tail),
                                                         img.length)
        except _zip.ZipFormatError:     # a zip comment longer than what was read
            n = min(img.length, _zip.TAIL_BYTES)
            cd_off, cd_size, count = _zip.find_directory(img.read(img.length - n, n),
                                                         img.length - n, img.length)
        entries = {e.name: e for e in _zip.parse_directory(img.read(cd_off, cd_size), count)}
        pkl = [k for k in entries if k == "data.pkl" or k.endswith("/data.pkl")]
        if not pkl:
            raise ValueError("no data.pkl record")
        prefix = pkl[0][:-len("data.pkl")]

        def data_of(e):
            if e.method != 0 or e.compressed != e.size:
                raise ValueError("record %s is compressed" % e.name)
            e.data_offset = _zip.data_offset(e, img.read(e.header_offset, _zip.LOCAL_SIZE))
            if e.data_offset + e.size > img.length:
                raise ValueError("record %s extends past the item" % e.name)
            return e.data_offset

        pe = entries[pkl[0]]
        data = img.read(data_of(pe), pe.size)
        from torch import _weights_only_unpickler  # torch-private: looked up when used
        up = _weights_only_unpickler.Unpickler(io.BytesIO(bytes(data)), encoding="utf-8")
        meta = _MetaUnpickler()
        up.persistent_load = meta
        t = up.load()
        if not isinstance(t, torch.Tensor) or len(meta.keys) != 1:
            raise ValueError("it holds %s, not one tensor" % type(t).__name__)
        key, (_, nbytes) = next(iter(meta.keys.items()))
        # the view must lie inside its storage (torch.load's set_ checks it on
        # real storage; a meta one takes any): else the read would take the
        # bytes that follow the record in the file
        if t.numel():
            if any(st < 0 for st in t.stride()) or t.storage_offset() < 0:
                raise ValueError("the tensor has negative strides %s or storage offset %d"
                                 % (tuple(t.stride()), t.storage_offset()))
            last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
            if (last + 1) * t.element_size() > nbytes:
                raise ValueError("the tensor (size %s, stride %s, storage offset %d) reaches "
                                 "element %d of a storage of %d bytes"
                                 % (tuple(t.shape), tuple(t.stride()), t.storage_offset(),
                                    last, nbytes))
        e = entries.get(prefix + "data/" + key)
        if e is None:
            raise ValueError("record data/%s is missing" % key)
        if e.size != nbytes:
            raise ValueError("record data/%s holds %d bytes, its storage needs %d"
                             % (key, e.size, nbytes))
        return _Saved(t, data_of(e))


class _ImageBytes:
    """Random access to one image through the bytes read already (its head
    and tail), reading from the file what they do not cover."""

    def __init__(self, f, base, length, head, tail):
        self.f = f
        self.base = base
        self.length = length
        self.head = head
        self.tail = tail

    def read(self, off, n):
        if off < 0 or n < 0 or off + n > self.length:
            raise ValueError("a zip structure at %d (%d bytes) lies outside the item" % (off, n))
        if self.tail is None:
            return self.head[off:off + n]
        if off + n <= len(self.head):
            return self.head[off:off + n]
        t0 = self.length - len(self.tail)
        if off >= t0:
            return self.tail[off - t0:off - t0 + n]
        b = bytearray(n)
        if n:
            self.f.pread(b, self.base + off)
        return b


def _span(v):
    """(first byte, byte count) of a strided tensor's storage that it uses."""
    es = v.element_size()
    if v.numel() == 0:
        return v.storage_offset() * es, 0
    last = v.storage_offset() + sum((s - 1) * st for s, st in zip(v.size(), v.stride()))
    return v.storage_offset() * es, (last - v.storage_offset() + 1) * es


def _read_device(f, pieces):
    """Start reading [(uint8 tensor over device memory, file offset)]
    straight into device memory (libnvio takes a vector all on one device,
    cuFile one buffer per op): a GDS handle gets an op per piece, any other
    handle vectored ops per device (its bounce buffers). Their futures."""
    gds = f.handle.uses_gds()
    groups = {}
    for t, off in pieces:
        groups.setdefault(_device.location(t.untyped_storage()), []).append((t, off))
    futs = []
    for group in groups.values():
        if gds:
            futs += [f.pread_async(t, off) for t, off in group]
        else:
            futs += [f.preadv_async(part, _nvio.OFFSET_PER_IOV) for part in _disjoint(group)]
    return futs


def _disjoint(vec):
    """Split (buffer, offset) pieces into runs with increasing, non-overlapping
    offsets (one vectored op each)."""
    vec = sorted(vec, key=lambda p: p[1])
    runs = []
    for buf, off in vec:
        n = buf.nbytes if isinstance(buf, torch.Tensor) else len(buf)
        for run in runs:
            if run[1] <= off:
                run[0].append((buf, off))
                run[1] = off + n
                break
        else:
            runs.append([[(buf, off)], off + n])
    return [r[0] for r in runs]


# --- dcp.save / async_save / load with nvio's storage ---------------------------


def _gloo_group(group):
    """group (None: the default one) where a dead rank can be named from
    its store: initialized, gloo, two ranks or more; else None."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    g = group if group is not None else dist.group.WORLD
    try:
        if dist.get_world_size(g) < 2 or dist.get_backend(g) != "gloo":
            return None
    except (RuntimeError, ValueError):
        return None
    return g


def _watch(group, timeout):
    """The group helper (nvio._base.group) for ``group``, which makes
    this process beat its heartbeat in the group's store from here on (a
    death inside DCP's collectives can then be told); None where there is
    no such group."""
    g = _gloo_group(group)
    if g is None:
        return None
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=timeout)
    try:
        return Group(g, None, timeout)
    except Exception:   # noqa: BLE001 - naming the dead is best effort; DCP runs anyway
        return None


def _named(store, e, path, what, watch=None):
    """The error to raise for e, the one dcp.save/load raised. When a rank
    died, DCP's next collective fails with the transport's error
    ("connection closed") on the others: the error that names the rank is
    the writer's (``store.failure``, set by its barrier) or, where the rank
    died inside DCP's own collectives (gathering or scattering plans,
    metadata, results), the group's store's, asked here: a CheckpointError
    saying "Rank N died ..." on every surviving rank."""
    f = getattr(store, "failure", None)
    if f is not None and f is not e:
        return f
    if watch is None or isinstance(e, CheckpointError) and "died" in str(e):
        return e
    if isinstance(e, _DCPException):
        return e    # every rank's own error, gathered: each rank came, none died
    try:
        c = watch.cause(what, e)
    except Exception:   # noqa: BLE001 - best effort: the original error stands
        return e
    if not isinstance(c, GroupFailure) or not c.dead:
        return e
    return CheckpointError("nvio.dcp: %s: %s failed on rank %d: %s; %s"
                           % (path, what, watch.rank, c,
                              "the directory keeps the previous checkpoint (if any) unless "
                              "rank 0 had written the new .metadata" if what.startswith("dcp.save")
                              else "the state_dict may be partly loaded"),
                           str(path))


def _group_of(process_group, kwargs):
    """The group DCP saves over (the default one when none is given), for
    the writer's checks that name a rank that died."""
    if process_group is None and dist.is_available() and dist.is_initialized() \
            and not kwargs.get("no_dist"):
        return dist.group.WORLD
    return process_group


# nvio.dcp.save, async_save and load run with Python's cyclic collector
# paused (gc_paused as a decorator: as it was after). DCP's planning makes
# several objects per item, enough for 5,000 items to start a full
# collection, which walks every object of the process: 0.12 s with torch
# imported, 0.14 s of a 1.07 s save of 5,000 tensors (measured). DCP pauses
# it the same way in its get/set_state_dict.


@gc_paused()
def save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None,
         process_group=None, **kwargs):
    """``dcp.save`` with nvio's :class:`FileSystemWriter` (on
    ``checkpoint_id``, with ``process_group``) unless ``storage_writer`` is
    given. The one difference from calling ``dcp.save`` yourself: when a rank
    dies during the save, whatever the moment (in the writes, or inside
    DCP's own collectives), the exception raised here on every surviving
    rank is a :class:`~nvio.checkpoint.CheckpointError` naming that rank
    ("Rank N died ..."), from the heartbeats every rank beats in the
    group's store (gloo groups; chained to the transport's error that
    ``dcp.save`` raises). And Python's cyclic collector is paused for the
    call (DCP's planning would start full collections)."""
    group = _group_of(process_group, kwargs)
    w = storage_writer if storage_writer is not None else \
        FileSystemWriter(checkpoint_id, process_group=group)
    if isinstance(w, FileSystemWriter):
        w.failure = None        # not a previous save's
    watch = _watch(group, getattr(w, "timeout", None))
    where = getattr(w, "path", checkpoint_id)
    try:
        return _dcp.save(state_dict, checkpoint_id=checkpoint_id, storage_writer=w,
                         planner=planner, process_group=process_group, **kwargs)
    except Exception as e:
        n = _named(w, e, where, "dcp.save", watch)
        if n is e:
            raise
        raise n from e


@gc_paused()
def async_save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None,
               process_group=None, **kwargs):
    """``dcp.async_save`` with nvio's writer, as :func:`save`: the returned
    future's exception names a rank that died (when DCP returns a future),
    and no cyclic collection runs inside the call (its planning and staging;
    the write behind it runs with the collector as it is)."""
    group = _group_of(process_group, kwargs)
    w = storage_writer if storage_writer is not None else \
        FileSystemWriter(checkpoint_id, process_group=group)
    if isinstance(w, FileSystemWriter):
        w.failure = None        # not a previous save's
    watch = _watch(group, getattr(w, "timeout", None))
    where = getattr(w, "path", checkpoint_id)
    try:
        fut = _dcp.async_save(state_dict, checkpoint_id=checkpoint_id, storage_writer=w,
                              planner=planner, process_group=process_group, **kwargs)
    except Exception as e:
        n = _named(w, e, where, "dcp.save (async)", watch)
        if n is e:
            raise
        raise n from e
    if not isinstance(fut, _cf.Future):
        return fut
    out = _cf.Future()

    def done(f):
        e = f.exception()
        if e is None:
            out.set_result(f.result())
        else:
            n = _named(w, e, where, "dcp.save (async)", watch)
            if n is not e:
                n.__cause__ = e
            out.set_exception(n)
    fut.add_done_callback(done)
    return out


@gc_paused()
def load(state_dict, *, checkpoint_id=None, storage_reader=None, planner=None,
         process_group=None, **kwargs):
    """``dcp.load`` with nvio's :class:`FileSystemReader` on ``checkpoint_id``
    unless ``storage_reader`` is given. As :func:`save`, a rank that dies
    during the load is named on every surviving rank (gloo groups), and the
    cyclic collector is paused for the call."""
    r = storage_reader if storage_reader is not None else FileSystemReader(checkpoint_id)
    watch = _watch(_group_of(process_group, kwargs), None)
    try:
        return _dcp.load(state_dict, checkpoint_id=checkpoint_id, storage_reader=r,
                         planner=planner, process_group=process_group, **kwargs)
    except Exception as e:
        n = _named(r, e, getattr(r, "path", checkpoint_id), "dcp.load", watch)
        if n is e:
            raise
        raise n from e
