"""A torch.save file image laid out: the pickle, the storages, their offsets.

``Plan(obj, path)`` pickles ``obj`` the way ``torch.save`` does (protocol 2,
every storage replaced by the persistent id
``("storage", storage_type, key, location, numel)``, one record per storage
however many tensors view it) and lays out the records of torch's zip
format (:mod:`.torchzip`) with each storage's data on a multiple of
``align``: data.pkl and the small records first, as torch.save has them.
Making such a Plan neither opens nor writes a file, so an object that
cannot be pickled fails before anything on disk is touched. Shared by
nvio.save (checkpoint), nvio.dcp (one image per item) and the offload
optimizer's state files; their CRCs come from :mod:`.crc`.

``Plan(obj, path, grow=callback)`` lays the tensor records out first
instead, as the pickler meets their storages, and calls back every
GROW_BYTES of them: nvio.save's :class:`ImageStream` starts writing the
first windows of a checkpoint of many small tensors while the rest is
still being pickled. Readers find records by the zip directory, so the
order is nobody's concern but the writer's (torch.load, mmap'ed or not,
zipfile and nvio.load read both). nvio.dcp streams a rank file of many
small items through the same class, one whole archive at a time.

``write_images`` writes a file of such images (one, for nvio.save when
it does not stream and for async_save) window by window
through ``_nvio.ZipImage``: tensor bytes copied and checksummed in one pass
in C, headers, descriptors and directories filled in around them.
``write_plans`` writes such images with their large tensors straight from
their memory instead (one vectored op, libnvio taking the CRC-32s as it
moves them), then the runs of everything else between them: nvio.save's
and nvio.dcp's files of larger tensors. Plain CPU tensors are reduced for
the pickle in C (``_nvio.TensorReducer``).
"""
from __future__ import annotations

import array
import collections
import concurrent.futures
import contextlib
import copyreg
import ctypes
import errno
import gc
import io
import itertools
import os
import pickle
import random
import sys
import types
import zlib

import torch

from .. import _device, _nvio
from . import torchzip as _zip
from .crc import crc32_combine, crc_device
from .crc import executor as crc_executor
from .pieces import wait_all, write_device
from .views import u8

#: Record data aligned to this by default: the page size (every O_DIRECT
#: alignment Linux asks of a file on a local disk divides it).
DEFAULT_ALIGN = 4096
#: The zip format's version record, as torch writes it.
ZIP_VERSION = "3\n"
#: nvio's own marker record: the version of nvio's layout rules.
NVIO_FORMAT = 1
NVIO_RECORD = ".data/nvio_format"


class CheckpointError(ValueError):
    """A checkpoint cannot be written or read as asked: the message names the
    file and what is wrong (truncated, corrupt, newer format, a bad object).
    ``filename`` is the checkpoint's path. (Public as
    ``nvio.checkpoint.CheckpointError``; defined here, under every writer.)"""

    __module__ = "nvio.checkpoint"

    def __init__(self, msg, filename=None):
        super().__init__(msg)
        self.filename = filename


def archive_name(path):
    """The records' directory inside the zip, as torch names it: the file's
    name up to its last dot (``state.v1.pt`` -> ``state.v1``). Where that
    leaves nothing (``.hidden``), which torch.save refuses, or a name that
    is not UTF-8 (a file name of other bytes), "archive"."""
    base = os.path.basename(os.fsdecode(path)).rpartition(".")
    name = (base[0] if base[1] else base[2]) or "archive"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:      # a file name of bytes that are not UTF-8
        return "archive"
    return name


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection inside (as it was after). Pickling or
    unpickling a state of thousands of tensors makes enough containers to
    start several full collections, each walking every object of the
    process: 30-50% of Plan's time for 5,000 tensors, measured."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Ref:
    """A storage as the fast tensor reduction hands it to the pickler: what
    persistent_id needs, without building a TypedStorage per tensor."""

    __slots__ = ("storage", "dtype")

    def __init__(self, storage, dtype):
        self.storage = storage
        self.dtype = dtype


#: Plain tensors pickled by _tensor_reducer (the same bytes as torch's own
#: reduction; tests turn it off to compare).
FAST_REDUCE = True
#: Plain CPU tensors reduced in C (_nvio.TensorReducer); tests compare it
#: with the Python reduction.
C_REDUCE = True
#: Exact types persistent_id answers None for without further checks.
_PLAIN = frozenset((str, int, float, bool, type(None), tuple, list, dict, bytes,
                    collections.OrderedDict, torch.Size, torch.dtype, torch.device,
                    type, types.FunctionType, types.BuiltinFunctionType))
#: Exact types persistent_id answers None for, in C (persistent_id_filter):
#: the plain ones, tensors (their storage comes as a _Ref or a storage
#: object), and the legacy storage classes' metaclass (the ``FloatStorage``
#: of each persistent id is pickled as a global).
_PID_NONE = _PLAIN | {torch.Tensor, torch.nn.Parameter, type(torch.FloatStorage)}
#: dtype -> (storage class as pickled, element size), filled on first use
_stypes = {}


def _stype(dtype):
    st = _stypes.get(dtype)
    if st is None:
        ts = torch.storage.TypedStorage(wrap_storage=torch.UntypedStorage(0), dtype=dtype,
                                        _internal=True)
        st = _stypes[dtype] = (getattr(torch, ts._pickle_storage_type()),
                               torch._utils._element_size(dtype))
    return st


def _tensor_reducer(protocol, ids):
    """A dispatch-table reduction for plain tensors: the tuple torch's own
    Tensor.__reduce_ex__ returns for a dense CPU or CUDA tensor without
    Python state, hooks or a v3 dtype (``_rebuild_tensor_v2`` with its
    storage, offset, size, stride, requires_grad, empty hooks and the
    conj/neg metadata), built in a few microseconds instead of ~20;
    anything else goes to torch's. CPU tensors are reduced in C
    (``_nvio.TensorReducer``: their persistent id made there too, in
    ``ids``' dicts; about 2 us a tensor instead of 11), the others here."""
    rebuild = torch._utils._rebuild_tensor_v2
    strided = torch.strided
    v3 = frozenset(torch.storage._new_dtypes())
    tls = torch.serialization._serialization_tls
    od = collections.OrderedDict
    meta_of = torch._C._get_tensor_metadata
    has_storage = torch._C._has_storage

    def reduce(t):
        if (t.__dict__ or t._backward_hooks or t.layout is not strided or t.is_nested
                or t.is_quantized or not (t.is_cpu or t.is_cuda) or t.dtype in v3
                or getattr(tls, "skip_data", False) or not has_storage(t)):
            return t.__reduce_ex__(protocol)
        args = (_Ref(t.untyped_storage(), t.dtype), t.storage_offset(), tuple(t.size()),
                t.stride(), t.requires_grad, od())
        meta = meta_of(t)
        if meta:
            args += (meta,)
        return rebuild, args
    if not C_REDUCE:
        return reduce
    # a CPU storage's location tag is "cpu" unless a device provider (whose
    # memory looks like the CPU's) or a package's tagger may say otherwise
    plain_tags = _device.plain_cpu_tags()
    return _nvio.TensorReducer(
        slow=reduce, rebuild=rebuild, strided=strided, v3=v3, tls=tls,
        has_storage=has_storage, meta_of=meta_of, odict=od, stypes=_stypes,
        stype_fn=_stype, keys=ids.keys, storages=ids.storages, types=ids.types,
        dtypes=ids.dtypes, location=ids.location or ("cpu" if plain_tags else None),
        location_fn=_device.location, pickling_error=pickle.PicklingError,
        grow=ids.grow, grow_bytes=ids.grow_bytes, grow_extra=ids.grow_extra)


def _odict_reducer(protocol):
    """OrderedDict's own reduction for one without attributes (each
    tensor's empty backward hooks are one): asking the object instead costs
    a call of copyreg._slotnames that is never cached for a builtin type."""
    od = collections.OrderedDict

    def reduce(d):
        if d.__dict__:
            return d.__reduce_ex__(protocol)
        return od, (), None, None, iter(d.items())
    return reduce


class _StorageIds:
    """torch.save's persistent ids: each storage as
    ``("storage", storage_type, key, location, numel)``, keys given in the
    order storages are met. Apart from the pickler, so that the pickler's
    persistent_id (a C filter calling this) makes no reference cycle back to
    the pickler: the storages it holds are let go as soon as it is."""

    def __init__(self, storages, location, grow=None, grow_bytes=0, grow_extra=0,
                 off_cpu=None):
        self.storages = storages       # key -> UntypedStorage, in key order
        # the keys of storages not on the CPU, in key order (the C reduction
        # enters CPU storages only: the others all come through here)
        self.off_cpu = [] if off_cpu is None else off_cpu
        self.location = location       # every storage's location tag, if given
        self.keys = {}                 # storage._cdata -> key
        self.dtypes = {}               # data_ptr -> dtype
        self.types = {}                # key -> the storage's dtype as first pickled
        # grow(): called each time the storages met since its last call
        # reach grow_bytes (each counted as its bytes plus grow_extra)
        self.grow = grow
        self.grow_bytes = grow_bytes
        self.grow_extra = grow_extra
        self._pending = 0

    def __call__(self, obj):
        cls = type(obj)
        if cls is _Ref:
            storage = obj.storage
            dtype = obj.dtype
            stype, size = _stype(dtype)
            numel = storage.nbytes() // size
            fake = None
        elif cls in _PLAIN:
            return None
        elif isinstance(obj, torch.storage.TypedStorage):
            storage = obj._untyped_storage
            dtype = obj.dtype
            stype = getattr(torch, obj._pickle_storage_type())
            numel = obj._size()
            fake = getattr(obj, "_fake_device", None)
        elif isinstance(obj, torch.UntypedStorage):
            storage = obj
            dtype = torch.uint8
            stype = torch.UntypedStorage
            numel = storage.nbytes()
            fake = getattr(obj, "_fake_device", None)
        else:
            return None
        if storage.device.type != "meta" and storage.data_ptr() != 0:
            seen = self.dtypes.setdefault(storage.data_ptr(), dtype)
            if seen != dtype:
                raise pickle.PicklingError(
                    "cannot save two tensors or storages that view the same "
                    "memory as different dtypes (%s and %s)" % (seen, dtype))
        key = self.keys.get(storage._cdata)
        if key is None:
            key = self.keys[storage._cdata] = str(len(self.keys))
            self.storages[key] = storage
            self.types[key] = dtype
            if storage.device.type != "cpu":
                self.off_cpu.append(key)
            if self.grow is not None:
                self._pending += storage.nbytes() + self.grow_extra
                if self._pending >= self.grow_bytes:
                    self._pending = 0
                    self.grow()
        location = (str(fake) if fake is not None else self.location or
                    _device.location(storage))
        return ("storage", stype, key, location, numel)


class _GrowError(Exception):
    """Carries an error of Plan's grow callback through the pickler (whose
    errors Plan reports as an object that cannot be pickled)."""


class _Pickler(pickle.Pickler):
    """torch.save's pickling: storages become persistent ids."""

    def __init__(self, file, protocol, storages, location=None, fast=None, grow=None,
                 grow_bytes=0, grow_extra=0, off_cpu=None):
        self._ids = _StorageIds(storages, location, grow, grow_bytes, grow_extra, off_cpu)
        if FAST_REDUCE if fast is None else fast:
            # before Pickler.__init__, which looks the table up once
            table = dict(copyreg.dispatch_table)
            table.setdefault(torch.Tensor, _tensor_reducer(protocol, self._ids))
            table.setdefault(collections.OrderedDict, _odict_reducer(protocol))
            self.dispatch_table = table
            # answered in C for the plain types (most objects pickled)
            self.persistent_id = _nvio.persistent_id_filter(_PID_NONE, self._ids)
        super().__init__(file, protocol=protocol)

    def persistent_id(self, obj):
        return self._ids(obj)


class Plan:
    """A checkpoint laid out: records with offsets, the small records' bytes,
    and the storages whose bytes go to the data records. ``location``: the
    location tag every storage records (by default its own: "cpu",
    "cuda:0"); DCP's images say "cpu" wherever the tensor is.

    ``layouts`` (a dict the caller keeps, empty at first): plans made with
    the same dict reuse each other's layout where it must come out the
    same: the same pickle bytes, storage sizes, alignments and archive
    name. The records are copied (a writer sets each tensor record's CRC)
    and the serialization id is drawn anew; what is saved is the image a
    plan of its own would give. DCP lays out one image per item, most of
    them alike (the layers of a model): a copy costs a few microseconds
    where a layout costs tens."""

    def __init__(self, obj, path, align=DEFAULT_ALIGN, protocol=2, archive=None,
                 meta_align=None, location=None, grow=None, layouts=None):
        # no collection while the thousands of containers of a big state's
        # pickle and records are made: one full collection costs more than
        # the layout itself (0.09 s of 0.05-0.14 s for 5,000 tensors)
        with gc_paused():
            self._build(obj, path, align, protocol, archive, meta_align, location, grow,
                        layouts)

    def _build(self, obj, path, align, protocol, archive, meta_align, location, grow,
               layouts):
        if align < 64 or align & (align - 1):
            raise ValueError("nvio: align must be a power of two >= 64, not %r" % (align,))
        if meta_align is not None and (meta_align < 1 or meta_align & (meta_align - 1)):
            raise ValueError("nvio: meta_align must be a power of two, not %r" % (meta_align,))
        self.path = os.fsdecode(path)
        self.storages = {}
        self.align = align
        # small records need no O_DIRECT alignment: meta_align (torch.save's
        # 64, say) packs them, so that many small images (DCP) stay small
        self.meta_align = meta_align or align
        self.layout = _zip.Layout(align)
        self.meta = {}         # record name -> bytes (the small records)
        self.data = []         # (Record, UntypedStorage) in file order
        self._pre = (archive or archive_name(path)) + "/"
        #: the keys of the storages that are not on the CPU, in key order
        self.off_cpu = []
        buf = io.BytesIO()
        kw = {}
        if grow is not None:
            def grown():
                try:
                    self._lay_out_data()
                    grow(self)
                except Exception as e:
                    raise _GrowError() from e
            kw = dict(grow=grown, grow_bytes=GROW_BYTES, grow_extra=align)
        try:
            pickler = _Pickler(buf, protocol, self.storages, location,
                               off_cpu=self.off_cpu, **kw)
            pickler.dump(obj)
            #: each storage's dtype (as its persistent id says), in key order
            self.dtypes = list(pickler._ids.types.values())
            del pickler
        except _GrowError as e:             # the grow callback's own error
            raise e.__cause__ from None
        except (pickle.PicklingError, TypeError, AttributeError, RuntimeError) as e:
            raise CheckpointError("nvio.save: %s: cannot pickle the object: %s"
                                  % (self.path, e), self.path) from e
        for key in self.off_cpu:
            if self.storages[key].device.type == "meta":
                raise CheckpointError("nvio.save: %s: storage %s is on the meta device "
                                      "(it has no data to save)" % (self.path, key),
                                      self.path)
        #: every storage is in host memory (none on a device, none a device
        #: provider's): the packed writer may copy them all
        self.on_host = not self.off_cpu and not _device.any_provided(self.storages.values())
        pre = self._pre
        pkl = buf.getvalue()
        key = None
        if layouts is not None and grow is None:
            key = (pkl, align, self.meta_align, pre,
                   tuple(s.nbytes() for s in self.storages.values()))
            like = layouts.get(key)
            if like is not None:
                self._lay_out_like(like)
                return
        small = [("data.pkl", pkl), (".format_version", b"1"),
                 (".storage_alignment", str(align).encode()),
                 ("byteorder", sys.byteorder.encode())]
        if grow is not None:        # the tensor records first, as they were met
            self._lay_out_data()
        for name, b in small:
            self._add_meta(pre + name, b)
        self._lay_out_data()
        self._add_meta(pre + "version", ZIP_VERSION.encode())
        self._add_meta(pre + NVIO_RECORD, str(NVIO_FORMAT).encode())
        self._add_meta(pre + _SERIALIZATION_ID, _serialization_id())
        # the directory's length does not depend on the CRCs: size it now
        self.dir_offset = self.layout.cursor
        self.size = self.layout.cursor + self.layout.directory_size()
        if key is not None:
            layouts[key] = self

    def _lay_out_like(self, like):
        """like's layout for this plan's storages (see the class): its small
        records shared (nothing changes them once made), its tensor records
        copied with no CRC, the serialization id's record made anew."""
        sid = self._pre + _SERIALIZATION_ID
        storages = iter(self.storages.values())
        records = []
        self.meta = dict(like.meta)
        for r in like.layout.records:
            if r.name == sid:
                b = self.meta[sid] = _serialization_id()
                r = _zip.Record(r.name, r.size, r.header_offset, r.data_offset,
                                zlib.crc32(b), r.local)
            elif r.name not in self.meta:
                r = _zip.Record(r.name, r.size, r.header_offset, r.data_offset, 0, r.local)
                self.data.append((r, next(storages)))
            records.append(r)
        self.layout = _zip.Layout(like.align, records, like.layout.cursor)
        self.dir_offset = like.dir_offset
        self.size = like.size

    def _lay_out_data(self):
        """Records for the storages the pickler met since the last call, in
        key order, at the layout's end."""
        n = len(self.data)
        if n == len(self.storages):
            return
        add, pre, data = self.layout.add, self._pre + "data/", self.data
        for key, s in itertools.islice(self.storages.items(), n, None):
            data.append((add(pre + key, s.nbytes()), s))

    def _add_meta(self, name, b):
        r = self.layout.add(name, len(b), self.meta_align)
        r.crc = zlib.crc32(b)
        self.meta[name] = b

    @property
    def data_bytes(self):
        return sum(r.size for r, _ in self.data)

    def meta_pieces(self):
        """(offset, bytes) of everything that is not tensor data: headers,
        small records, descriptors, the directory; runs merged (a run goes
        from one tensor record's data to the next: its descriptor, the
        next local headers, small records). Needs every data record's crc."""
        runs = []
        meta = self.meta
        start, parts, pos = 0, [], 0
        for r in self.layout.records:
            if r.header_offset != pos:          # never in nvio's layouts
                if parts:
                    runs.append((start, b"".join(parts)))
                start, parts = r.header_offset, []
            parts.append(r.local)
            m = meta.get(r.name)
            if m is not None:
                parts.append(m)
            elif r.size:                        # tensor bytes: the run ends
                if parts:
                    runs.append((start, b"".join(parts)))
                start, parts = r.end, []
            parts.append(r.descriptor())
            pos = r.end + r.descriptor_size
        if self.dir_offset != pos:
            if parts:
                runs.append((start, b"".join(parts)))
            start, parts = self.dir_offset, []
        parts.append(self.layout.directory())
        runs.append((start, b"".join(parts)))
        return runs


#: The record of a random id torch.save gives each file (torch logs it).
_SERIALIZATION_ID = ".data/serialization_id"


class _SerializationIds(random.Random):
    """The serialization ids' generator: seeded from the OS once, and again
    in a forked child (whose ids must differ from its parent's). Not
    secrets.randbits: its system call per id releases the GIL for a
    moment, and a thread laying out thousands of plans (a DCP rank file's)
    that releases and retakes it every few microseconds starves the futures'
    reaper thread, which never gets the GIL in that instant: measured, the
    windows written meanwhile went at 0.4-0.7 GB/s instead of 1.9."""

    def __init__(self):
        super().__init__(os.urandom(32))
        os.register_at_fork(after_in_child=lambda: self.seed(os.urandom(32)))


_ids = _SerializationIds()


def _serialization_id():
    """A new serialization id: 40 decimal digits, as torch.save writes (a
    random number only tells saves apart; torch logs it)."""
    return str(_ids.getrandbits(128)).zfill(40).encode()


#: A file of at least PACK_MIN_RECORDS storages averaging at most
#: PACK_MEAN_MAX bytes, all in host memory, is written as its image through
#: windows (write_images): one copy with the CRC in the same pass, whole-
#: window O_DIRECT writes, instead of a write per storage and a CRC pass.
PACK_MIN_RECORDS = 64
PACK_MEAN_MAX = 1 << 20
#: Bytes of file per window, and how many windows are in use at a time
#: (one being filled while the others are written).
PACK_WINDOW = 32 << 20
PACK_WINDOWS = 2
#: A Plan made with a grow callback calls it each time the storages met
#: since the last call reach this many bytes (each counted with its
#: record's alignment): a window's worth.
GROW_BYTES = PACK_WINDOW


def packs(plans):
    """Whether a file of these plans' archives is written through windows
    (see PACK_MIN_RECORDS)."""
    return (_pack_sizes(sum(len(p.data) for p in plans), sum(p.data_bytes for p in plans))
            and all(p.on_host for p in plans))


def packs_storages(storages):
    """packs' rule for a file of these storages, a record each, before any
    plan is made (a DCP rank file's tensors)."""
    return (_pack_sizes(len(storages), sum(s.nbytes() for s in storages)) and
            all(s.device.type == "cpu" for s in storages) and
            not _device.any_provided(storages))


def _pack_sizes(n, nbytes):
    """Whether n storages of nbytes in all are many and small enough to pack."""
    return n >= PACK_MIN_RECORDS and nbytes <= n * PACK_MEAN_MAX


def image_item(plan, sources, base=0):
    """plan's archive as an item of ``_nvio.ZipImage`` (at file offset base;
    sources: each storage's address in plan.data's order, or the address
    of an image in memory holding the tensor bytes at their offsets)."""
    return (base, plan.layout.records, plan.meta, sources, plan.dir_offset, plan.size)


def fill_window(img, base, w0, w1):
    """Window [w0, w1) of a ZipImage (made with crc_executor().n parts) at
    address base: its tensor bytes copied and checksummed by the caller
    and the CRC threads side by side, the GIL released (``img.copy``),
    then its CRCs joined and its headers, descriptors and directories
    filled in (``img.fill``)."""
    ex = crc_executor()
    parts = [ex.submit(img.copy, base, w0, w1, p) for p in range(1, ex.n)]
    try:
        img.copy(base, w0, w1, 0)
    finally:
        concurrent.futures.wait(parts)
    for p in parts:
        p.result()
    img.fill(base, w0, w1)


def write_image(plan, f, sources, window=None, buffer=None, check=None):
    """Write plan's file image to f window by window (:func:`write_images`
    of its one archive)."""
    write_images(f, [image_item(plan, sources)], plan.size, window, buffer, check)


def write_images(f, items, size, window=None, buffer=None, check=None, checksum=True):
    """Write a file of ``size`` bytes made of ``items`` (``_nvio.ZipImage``'s:
    archives from :func:`image_item`, raw (offset, bytes); zeros between)
    to f window by window, in file order. Tensor bytes are copied into
    PACK_WINDOWS page-aligned buffers of ``window`` bytes (PACK_WINDOW by
    default; one filled while the others are written); or with ``buffer``, a LockedBuffer that holds
    the image's tensor bytes at their offsets already (async_save's
    snapshot: the sources are its address), windows are checksummed,
    filled in and written in place. Each window: its tensor bytes copied
    and checksummed in one pass by the CRC threads and the caller side by
    side, the GIL released (``ZipImage.copy``), then its CRCs joined and
    its headers, descriptors and directories filled in
    (``ZipImage.fill``), then its write started. ``check()``, if given,
    runs before each write (a cancelled save raises there).
    ``checksum=False``: no CRC computed (the records' crc as they are)."""
    img = _nvio.ZipImage(items, size, crc_executor().n, _zip.ZIP64_LIMIT, checksum)
    window = window or PACK_WINDOW
    if buffer is None:
        window = min(window, -(-size // 4096) * 4096)
        nwin = max(2, PACK_WINDOWS)
        bufs = [_nvio.LockedBuffer(window) for _ in range(nwin)] if size else []
    else:
        nwin = 1 << 30                        # every window has its own bytes
        bufs = [buffer]
    futs = {}
    try:
        for k, w0 in enumerate(range(0, size, window)):
            w1 = min(w0 + window, size)
            slot = k % nwin
            if buffer is None:
                fut = futs.pop(slot, None)
                if fut is not None:
                    fut.result()              # its buffer is free again
                mv = memoryview(bufs[slot])[:w1 - w0]
                base = bufs[slot].address
            else:
                mv = memoryview(buffer)[w0:w1]
                base = buffer.address + w0
            fill_window(img, base, w0, w1)
            if check is not None:
                check()
            futs[slot if buffer is None else k] = f.pwrite_async(mv, w0)
            del mv
    finally:
        wait_all(list(futs.values()))      # buffers are busy until then
    del bufs


class Restart(Exception):
    """A streamed save met a storage it cannot copy (not in host memory)
    after its first windows were written: the save starts over without
    streaming (:class:`ImageStream`)."""


class ImageStream:
    """nvio.save's packed write, started while the pickler still runs.

    A Plan made with ``grow=stream.grow`` lays its tensor records out first
    in the file, as the pickler meets their storages, and calls grow every
    GROW_BYTES of them. Once the records met qualify for the packed writer
    (:func:`packs`: enough of them, small on average, all in host memory),
    the stream turns them into a ``_nvio.ZipImage`` that it extends at each
    call, and writes every window that is laid out whole and has a free
    buffer (never waiting for one: the pickler goes on meanwhile). So the
    device starts on the first windows while the rest of the state is
    still being pickled, instead of after the pickle and the layout (40-60
    ms of a 0.4-0.5 s save of 5,000 tensors). :meth:`finish` adds the
    pickle, the small records and the directory, which follow the tensor
    records, and writes the rest. A storage that is not in host memory
    met after the stream started raises :class:`Restart`; met before, the
    stream never starts and the plan is written as any other.

    The file's space is allocated ahead of the writes as the layout grows
    (:meth:`_allocate`): a full disk still fails the save with ENOSPC, and
    no write extends the file.

    A file of many whole archives (a DCP rank file of small tensor items)
    streams the same way: :meth:`start` with its raw items, :meth:`add`
    for each archive as it is laid out, :meth:`finish` with no plan.
    ``checksum=False``: no CRC computed (the records' crc as they are)."""

    #: The first allocation's least size; later ones double what is allocated.
    ALLOC_STEP = 32 << 20

    def __init__(self, f, window=None, expect=0, checksum=True, most=None):
        self.f = f
        self.checksum = checksum
        self.window = window or PACK_WINDOW
        if most is not None:      # the file's size at most: no window larger
            self.window = max(4096, min(self.window, -(-most // 4096) * 4096))
        # expect: the file's likely size (the one it replaces, or an estimate)
        self.guessed = False      # allocated past the layout on that guess
        self.img = None           # the ZipImage, once the stream started
        self.off = False          # never starts: a storage not in host memory
        self.added = 0            # plan.layout.records given to img
        self.end = 0              # the image's laid-out bytes
        self.next = 0             # the next window's start
        self.k = 0                # the next window's number
        self.allocated = 0        # bytes of the file allocated (None: no fallocate)
        # a spare's old blocks are there: allocating them costs nothing, and
        # libnvio then knows that no write extends the file (it would
        # allocate before each write else, draining the ones in flight)
        self.expect = max(expect, os.fstat(f.fd).st_size if hasattr(f, "fd") else 0)
        self.bufs = [None] * max(2, PACK_WINDOWS)
        self.futs = {}            # slot -> the future of its window's write

    @property
    def started(self):
        return self.img is not None

    def grow(self, plan):
        """Plan's callback: check and add the records laid out since the
        last call, write the windows that are ready."""
        self._check(plan)
        if self.img is None:
            if self.off or not _pack_sizes(len(plan.data), plan.data_bytes) or \
                    _device.any_provided(s for _, s in plan.data):
                return
            self.start()
        self._extend(plan)
        self._pump(wait=False)

    def start(self, items=(), size=0):
        """Start the image, with ZipImage's ``items`` (raw (offset, bytes)
        items, whole archives) up to ``size``."""
        self.img = _nvio.ZipImage(list(items), size, crc_executor().n, _zip.ZIP64_LIMIT,
                                  self.checksum)
        self.end = size

    def add(self, base, plan):
        """A whole archive at file offset base (past the image's end) joins
        the image; the windows that are ready are written."""
        self.img.extend(base, plan.layout.records, plan.meta,
                        [s.data_ptr() for _, s in plan.data], plan.dir_offset, plan.size)
        self.end = base + plan.size
        self._allocate(False)
        self._pump(wait=False)

    def _check(self, plan):
        """Restart if a storage met since the last call is not in host
        memory and the stream started; never start if it did not."""
        if plan.off_cpu:
            if self.img is not None:
                raise Restart()
            self.off = True

    def _extend(self, plan, close=False):
        """Give the image the records laid out since the last call (with
        ``close``: all the rest, and its directory)."""
        recs = plan.layout.records
        new = recs[self.added:]
        srcs = [s.data_ptr() for _, s in itertools.islice(plan.data, self.added, None)]
        if close:
            self.img.extend(0, new, plan.meta, srcs, plan.dir_offset, plan.size)
            self.end = plan.size
        else:
            self.img.extend(0, new, plan.meta, srcs)
            self.end = plan.layout.cursor
        self.added = len(recs)
        self._allocate(close)

    def _allocate(self, close):
        """Allocate the laid-out bytes ahead of the writes (a direct write
        past the end of the file is a slow, blocking one). ext4's fallocate
        first waits for every direct write in flight, so it is called
        seldom: once before the first write, for as much as the file it
        replaces held (``expect``: the next checkpoint is most often the
        size of the last), then each time the layout has doubled, then
        for the rest once closed; what the guess allocated too much is
        cut off at the close."""
        a = self.allocated
        if a is None:
            return
        end = self.end
        if close:
            if end < a and self.guessed:
                self.f.truncate(end)      # the guess was too large
                self.allocated = end
                return
            if end <= a or end < 1 << 20:
                return
        elif a == 0 and self.expect > end:
            end = self.expect
        elif end - a < max(self.ALLOC_STEP, a):
            return
        try:
            self.f.allocate(a, end - a)
        except _nvio.NvioError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) and end > self.end:
                self.expect = 0           # the guess did not fit: what is laid out
                return self._allocate(close)
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self.allocated = None         # the writes allocate as they go
            return
        self.guessed = self.guessed or end > self.end
        self.allocated = end

    def _pump(self, wait):
        """Write the laid-out windows in order; without ``wait``, only while a
        buffer is free."""
        img = self.img
        # only what is allocated (all of it once closed, or without fallocate)
        end = self.end if self.allocated is None or wait else min(self.end, self.allocated)
        while self.next < end:
            w0 = self.next
            w1 = min(w0 + self.window, end)
            if w1 - w0 < self.window and not wait:
                return                    # a window not laid out whole yet
            slot = self.k % len(self.bufs)
            fut = self.futs.get(slot)
            if fut is not None:
                if not wait and not fut.done():
                    return
                fut.result()              # its buffer is free again
                del self.futs[slot]       # (kept for close() if the wait fails)
            buf = self.bufs[slot]
            if buf is None:
                buf = self.bufs[slot] = _nvio.LockedBuffer(self.window)
            fill_window(img, buf.address, w0, w1)
            mv = memoryview(buf)[:w1 - w0]
            self.futs[slot] = self.f.pwrite_async(mv, w0)
            del mv
            self.next = w1
            self.k += 1

    def finish(self, plan=None):
        """Write the rest of the plan (its last records, the pickle, the small
        records, the directory), or with no plan the rest of the archives
        added; False if the stream never started (the plan is the caller's
        to write)."""
        if self.img is None:
            return False
        if plan is not None:
            self._check(plan)
            self._extend(plan, close=True)
        else:
            self._allocate(True)
        self._pump(wait=True)
        self.close()
        return True

    def close(self):
        """Waits for the writes in flight (their buffers are busy until
        then); raises the first one's error."""
        futs, self.futs = list(self.futs.values()), {}
        try:
            wait_all(futs)
        finally:
            self.bufs = []


# --- the direct path: tensors straight from their memory -------------------


#: A host storage's bytes go to the file straight from its memory when its
#: page-aligned part is at least this long; smaller ones (a 0-dim AdamW
#: step, a norm's weight) and the unaligned ends of larger ones are written
#: with the headers and descriptors around them.
DIRECT_MIN = 64 << 10
#: O_DIRECT writes that never touch the page cache start and end on pages.
PAGE = 4096


def direct_range(r, s):
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


def write_plans(f, placed, checksum=True):
    """Write laid-out checkpoints [(base offset, Plan)] into an open writable
    nvio File whose space the caller has reserved (several torch.save
    images in one file, as DCP stores them): the whole pages of each large tensor in one vectored
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
    chunked copies to the host (``crc_device``). ``checksum=False``: no
    CRC taken, the records' crc as they are (DCP's crc32=False)."""
    host, dev = [], []
    for base, plan in placed:
        for r, s in plan.data:
            if _device.is_device(s):
                dev.append((base, r, s))
            else:           # host memory; another device's (mps, xpu) copied here
                host.append((base, r, s if s.device.type == "cpu" else s.cpu()))
    if dev:
        _device.synchronize([s for _, _, s in dev])   # torch's writes to them ended
    direct, views, pieces = {}, {}, []
    for base, r, s in host:
        if r.size:
            v = views[id(r)] = u8(s)
            a, b = direct[id(r)] = direct_range(r, s)
            if b > a:
                pieces.append((v[a - r.data_offset:b - r.data_offset], base + a))
    for _, r, _ in dev:
        direct[id(r)] = (r.data_offset, r.end)
    dev_crcs = [crc_executor().submit(crc_device, s, r.size) for _, r, s in dev] \
        if checksum else []
    futs = []
    # libnvio takes each direct piece's CRC-32 as it moves it (in the same
    # pass as its bounce copy of unaligned memory)
    direct_crcs = array.array("I", bytes(4 * len(pieces))) if checksum and pieces else None
    try:
        if pieces:
            futs.append(f.pwritev_async(pieces, _nvio.OFFSET_PER_IOV, crc32=direct_crcs))
        if dev:
            futs += write_device(f, [(u8(s), base + r.data_offset) for base, r, s in dev])
        if checksum:
            _host_crcs(host, direct, futs[0] if pieces else None, direct_crcs)
        for (_, r, _), crc in zip(dev, dev_crcs):
            r.crc = crc.result()
        meta = [(b, base + off) for base, plan in placed
                for off, b in _runs(plan, direct, views)]
        if meta:
            futs.append(f.pwritev_async(meta, _nvio.OFFSET_PER_IOV))
    finally:
        wait_all(futs)                    # also on an error: buffers are busy
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
