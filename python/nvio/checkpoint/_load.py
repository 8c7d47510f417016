"""nvio.load: torch checkpoints read in parallel straight into the tensors.

The zip directory is parsed in Python (a few small reads); the pickle is
unpickled with torch's weights-only unpickler (or, when asked, the full one)
whose persistent ids allocate each storage at its final place: page-aligned
host memory (locked with ``pin_memory=True``) or the GPU that
``map_location`` names. Then ONE vectored op reads every storage's record
into its memory; records on page boundaries (nvio's files) move with
O_DIRECT, others (torch.save's 64-byte alignment) are split by libnvio into
a buffered head and tail around a direct middle.
"""
from __future__ import annotations

import io
import os
import pickle
import struct
import sys

import torch

from .. import _device, _nvio
from .._base import torchzip as _zip
from .._base.crc import crc_submit
from .._base.handle import default_handle
from .._base.pieces import alloc_host as _alloc_host
from .._base.pieces import alloc_region as _alloc_region
from .._base.pieces import read_pieces as _read_pieces
from .._base.plan import NVIO_FORMAT, NVIO_RECORD, CheckpointError, gc_paused
from .._base.views import u8
from ._dist import load_group

__all__ = ["load", "load_plain", "Index", "open_index"]

#: The largest metadata record (byteorder, .storage_alignment, nvio's
#: layout version) read: such records hold a few bytes, and a corrupt file
#: must not make a load read gigabytes it does not need.
SMALL_RECORD_MAX = 4096


def _err(path, msg):
    return CheckpointError("nvio.load: %s: %s" % (path, msg), path)


class Index:
    """The records of a zip checkpoint: name -> _zip.Entry with data_offset."""

    def __init__(self, f, path):
        self.f = f
        self.path = path
        self.size = f.size
        self.entries = {}
        self.prefix = ""
        self.predicted = None     # records whose data_offset is a prediction
        self.referenced = None    # the tensor records the pickle references (None: all)

    def reference(self, keys):
        """Set self.referenced: the distinct records of the storage keys."""
        pre, entries = self.prefix + "data/", self.entries
        names = [pre + k for k in dict.fromkeys(keys)]
        self.referenced = [entries[n] for n in names if n in entries]

    def read_bytes(self, off, n):
        b = bytearray(n)
        if n:
            self.f.pread(b, off)
        return b

    def record(self, name, limit=SMALL_RECORD_MAX):
        """A record's bytes (whole); CheckpointError past ``limit`` bytes
        (None: any size)."""
        e = self.entries[self.prefix + name]
        self._check_entry(e)
        if limit is not None and e.size > limit:
            raise _err(self.path, "record %s holds %d bytes: more than the %d a %s record "
                       "may hold (SMALL_RECORD_MAX): the file is corrupt"
                       % (e.name, e.size, limit, name))
        return bytes(self.read_bytes(e.data_offset, e.size))

    def has(self, name):
        return self.prefix + name in self.entries

    def _check_entry(self, e):
        if e.method != 0 or e.compressed != e.size:
            raise _err(self.path, "record %s is compressed (method %d): torch "
                       "checkpoints store records uncompressed" % (e.name, e.method))
        if e.data_offset < 0 or e.data_offset + e.size > self.size:
            raise _err(self.path, "record %s (%d bytes at offset %d) extends past the "
                       "end of the file (%d bytes): the file is truncated"
                       % (e.name, e.size, e.data_offset, self.size))


def open_index(f, path, lazy=False):
    """Parse the zip directory of an open nvio File; None if it is no zip
    archive at all (a legacy torch.save file). ``lazy``: tensor records'
    data offsets predicted from the archive's alignment (``ix.predicted``
    lists them), to be confirmed by check_predicted() or made exact by
    settle()."""
    ix = Index(f, path)
    size = ix.size
    if size == 0:
        raise _err(path, "the file is empty")
    if size < _zip.EOCD_SIZE:
        if bytes(ix.read_bytes(0, size)).startswith(b"PK"):
            _raise_trunc(path)
        return None
    if bytes(ix.read_bytes(0, 4)) != b"PK\x03\x04":
        return None
    n = min(size, _zip.TAIL_BYTES)
    tail = ix.read_bytes(size - n, n)
    try:
        cd_off, cd_size, count = _zip.find_directory(tail, size - n, size)
        entries = _zip.parse_directory(ix.read_bytes(cd_off, cd_size), count)
    except _zip.ZipFormatError as e:
        raise _err(path, "%s (the file may be truncated or corrupt)" % e) from None
    for e in entries:
        ix.entries[e.name] = e
    pkl = [e.name for e in entries if e.name == "data.pkl" or e.name.endswith("/data.pkl")]
    if not pkl:
        raise _err(path, "no data.pkl record: not a torch checkpoint")
    ix.prefix = pkl[0][:-len("data.pkl")]
    # the local headers tell where each record's data starts: read their
    # fixed parts in one vectored op (in file order, as nvio wants them)
    mine = sorted((e for e in entries if e.name.startswith(ix.prefix)),
                  key=lambda e: e.header_offset)
    prev = None
    for e in mine:
        if e.header_offset + _zip.LOCAL_SIZE > size:
            _raise_trunc(path, e)
        if prev is not None and e.header_offset < prev.header_offset + _zip.LOCAL_SIZE:
            raise _err(path, "the local headers of records %s (offset %d) and %s (offset "
                       "%d) overlap: the file is corrupt" % (prev.name, prev.header_offset,
                                                             e.name, e.header_offset))
        prev = e
    if not lazy:
        _read_headers(f, path, mine)
        return ix
    # lazy: the tensor records' headers (one small random read each, 0.2-0.3 s
    # for 5,000 on a cold cache) are not read: their data offsets follow from
    # the archive's alignment; check_predicted() must confirm them
    data = [e for e in mine if e.name.startswith(ix.prefix + "data/")]
    _read_headers(f, path, [e for e in mine if not e.name.startswith(ix.prefix + "data/")])
    align = None
    if ix.has(".storage_alignment"):
        try:
            align = int(ix.record(".storage_alignment"))
        except (ValueError, CheckpointError):
            align = None
    if not align or align < 1 or align & (align - 1) or not data:
        _read_headers(f, path, data)
        return ix
    for e in data:
        e.data_offset = _zip.data_start(e.header_offset, e.name.encode("utf-8"), e.size, align)
    ix.predicted = data
    return ix


def _local_headers(f, recs):
    """The fixed part of each record's local header (one vectored read)."""
    n = _zip.LOCAL_SIZE
    mv = memoryview(bytearray(n * len(recs)))
    _read_pieces(f, [(mv[i * n:(i + 1) * n], e.header_offset) for i, e in enumerate(recs)])
    return [mv[i * n:(i + 1) * n] for i in range(len(recs))]


def _read_headers(f, path, recs):
    """Set each record's data_offset from its local header."""
    for e, local in zip(recs, _local_headers(f, recs)):
        try:
            e.data_offset = _zip.data_offset(e, local)
        except _zip.ZipFormatError as err:
            raise _err(path, "%s: the file is corrupt" % err) from None


class _Mispredicted(Exception):
    """A tensor record's data is not where its archive's alignment says."""


def settle(ix):
    """Exact data offsets for an index opened lazily (reads the headers)."""
    recs, ix.predicted = ix.predicted, None
    if recs:
        _read_headers(ix.f, ix.path, recs)


def check_predicted(ix, span):
    """Confirm the predicted data offsets from the local headers, taken from
    the span's region where it holds them (read otherwise); _Mispredicted if
    any differs (or a header is bad)."""
    recs, ix.predicted = ix.predicted, None
    if not recs:
        return
    lo, hi = span.base, span.base + len(span.mv)
    outside = [e for e in recs if not lo <= e.header_offset <= hi - _zip.LOCAL_SIZE]
    got = {id(e): h for e, h in zip(outside, _local_headers(ix.f, outside))} if outside else {}
    for e in recs:
        local = got.get(id(e))
        if local is None:
            o = e.header_offset - lo
            local = span.mv[o:o + _zip.LOCAL_SIZE]
        try:
            if _zip.data_offset(e, local) != e.data_offset:
                raise _Mispredicted(e.name)
        except _zip.ZipFormatError:
            raise _Mispredicted(e.name) from None


def _raise_trunc(path, e=None):
    where = " (record %s)" % e.name if e is not None else ""
    raise _err(path, "the zip archive is truncated%s" % where)


class _Span:
    """The tensor records the pickle references read with ONE read, started
    before unpickling, into one region laid out as the file is: each storage
    the unpickler asks for is a slice of it (so the storages share one
    allocation, freed once none is referenced any more). Records the pickle
    does not reference are not read (nor, by worth(), what lies between
    the referenced ones beyond headers and padding)."""

    def __init__(self, f, ix, pin):
        recs = self.records(ix)
        self.names = {e.name for e in recs}
        self.base = min(e.data_offset for e in recs) & ~4095   # O_DIRECT-aligned
        end = max(e.data_offset + e.size for e in recs)
        self.buf = _alloc_region(end - self.base, pin)
        self.mv = memoryview(self.buf)
        self.path = ix.path
        self.fut = f.pread_async(self.mv, self.base)

    @staticmethod
    def records(ix):
        """The tensor records to read: those of ix.referenced, else all."""
        if ix.referenced is not None:
            return ix.referenced
        return [e for n, e in ix.entries.items() if n.startswith(ix.prefix + "data/")]

    @staticmethod
    def worth(ix):
        """Whether the records are dense enough in the file for one read
        (nvio's and torch.save's files are: gaps are headers and padding)."""
        recs = _Span.records(ix)
        if not recs:
            return False
        lo = min(e.data_offset for e in recs)
        hi = max(e.data_offset + e.size for e in recs)
        data = sum(e.size for e in recs)
        return (data >= 1 << 20 and hi <= ix.size and
                hi - lo <= data + len(recs) * 8192 + (1 << 20))

    def storage(self, e):
        if e.size == 0:
            return torch.UntypedStorage(0)
        off = e.data_offset - self.base
        return torch.frombuffer(self.mv[off:off + e.size], dtype=torch.uint8).untyped_storage()

    def wait(self):
        """The read's end (also after an error: the region is busy until then)."""
        fut, self.fut = self.fut, None
        if fut is not None:
            n = fut.result()
            if n != len(self.mv):
                raise _err(self.path, "read %d of the %d bytes at offset %d: the file is "
                           "truncated" % (n, len(self.mv), self.base))


def _target(map_location, location):
    """Where a storage saved at ``location`` is read to: (device string or
    None for "read to the CPU, then restore", restore callable or None)."""
    if map_location is None:
        dev = location
    elif isinstance(map_location, (str, torch.device)):
        dev = str(map_location)
    elif isinstance(map_location, dict):
        dev = map_location.get(location, location)
        dev = str(dev)
    else:
        return "cpu", map_location
    d = torch.device(dev)
    if d.type in ("cpu", "cuda"):
        return str(d), None
    return "cpu", lambda s, loc: torch.serialization.default_restore_location(s, dev)


#: What unpickling a corrupt data.pkl raises (beyond UnpicklingError), made
#: into one CheckpointError that names the file (struct.error: torch's
#: unpickler unpacks a truncated BININT, BINFLOAT or length with struct).
_UNPICKLE_ERRORS = (KeyError, EOFError, IndexError, UnicodeDecodeError, TypeError,
                    ValueError, AttributeError, RuntimeError, OverflowError, struct.error)


class _Reader:
    """persistent_load for the unpickler: allocates storages, queues reads."""

    def __init__(self, ix, map_location, pin, eager, span=None):
        self.ix = ix
        self.map_location = map_location
        self.pin = pin
        self.eager = eager
        self.span = span        # a _Span: host storages come from its region
        self.storages = {}      # key -> TypedStorage
        self.reads = []         # (UntypedStorage, Entry) still to be read
        self.spanned = []       # (UntypedStorage, Entry) read by the span
        self.restores = []      # (key, restore, location)
        self.targets = {}       # location -> _target(...)

    def __call__(self, saved_id):
        if not isinstance(saved_id, tuple) or len(saved_id) != 5:
            raise _err(self.ix.path, "bad persistent id in data.pkl: %r" % (saved_id,))
        typename, stype, key, location, numel = saved_id
        if type(stype) is _Allowed:          # from the fast unpickler
            stype = stype.fn
        if isinstance(typename, bytes):
            typename = typename.decode("ascii")
        if typename != "storage":
            raise _err(self.ix.path, "unknown persistent id type %r in data.pkl" % (typename,))
        if isinstance(location, bytes):
            location = location.decode("ascii")
        key = str(key)
        dtype = torch.uint8 if stype is torch.UntypedStorage else stype.dtype
        if key in self.storages:
            return self.storages[key]
        nbytes = numel * torch._utils._element_size(dtype)
        e = self.ix.entries.get(self.ix.prefix + "data/" + key)
        if e is None:
            raise _err(self.ix.path, "record data/%s (a storage of %d bytes) is missing"
                       % (key, nbytes))
        self.ix._check_entry(e)
        if e.size != nbytes:
            raise _err(self.ix.path, "record data/%s holds %d bytes but its storage "
                       "needs %d: the file is corrupt" % (key, e.size, nbytes))
        t = self.targets.get(location)
        if t is None:
            t = self.targets[location] = _target(self.map_location, location)
        dev, restore = t
        if dev == "cpu" and restore is None and self.span is not None and e.name in self.span.names:
            s = self.span.storage(e)
            self.spanned.append((s, e))
            ts = torch.storage.TypedStorage(wrap_storage=s, dtype=dtype, _internal=True)
            self.storages[key] = ts
            return ts
        if dev == "cpu":
            s = _alloc_host(nbytes, self.pin)
        else:
            if torch.device(dev).type == "cuda" and not _device.cuda_available():
                raise _err(self.ix.path, "storage %s is to go to %s (map_location=%r) but "
                           "this process has no usable CUDA (torch.cuda.is_available() "
                           "is False); load with map_location='cpu'"
                           % (key, dev, self.map_location))
            s = _device.empty(nbytes, dev)
        self.reads.append((s, e))
        # restore() may copy the storage elsewhere: its bytes must be there
        if (self.eager or restore is not None) and nbytes:
            self.ix.f.pread(u8(s), e.data_offset)
        if restore is not None:
            s = restore(s, location)
            if s is None:
                s = torch.serialization.default_restore_location(self.reads[-1][0], location)
        ts = torch.storage.TypedStorage(wrap_storage=s, dtype=dtype, _internal=True)
        self.storages[key] = ts
        return ts

    def settle(self):
        """From here on every storage holds its bytes when the unpickler
        gets it (for rebuild functions that read tensor data, such as a
        nested tensor's sizes): the span's read ended, the storages handed
        out so far read, later ones read at once."""
        if self.span is not None:
            self.span.wait()
        if not self.eager:
            reads = sorted(self.reads, key=lambda r: r[1].data_offset)
            _read_pieces(self.ix.f, [(u8(s), e.data_offset) for s, e in reads if e.size])
            self.eager = True

    def check_sizes(self):
        """Every storage is still its record's size: a tensor in the pickle
        that reaches past its storage makes torch grow a resizable one
        (torch.load's storages refuse), which would hand out bytes the
        file does not hold."""
        for s, e in self.reads + self.spanned:
            if s.nbytes() != e.size:
                raise _err(self.ix.path, "a tensor of data.pkl reaches past its storage "
                           "(record %s: %d bytes, grown to %d): the file is corrupt"
                           % (e.name, e.size, s.nbytes()))


class _Allowed:
    """One global the fast weights-only unpickler hands out: calls go to
    ``fn``; nothing can be set on it (a BUILD or a slot state in the
    pickle fails instead of changing torch's own function or class)."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        object.__setattr__(self, "fn", fn)

    def __setattr__(self, name, value):
        raise pickle.UnpicklingError("the pickle sets %r on %r" % (name, self.fn))

    __delattr__ = __setattr__

    def __call__(self, *args):
        return self.fn(*args)


#: What the fast unpickler admits: the globals torch.save writes for dense
#: tensors and state dicts. Each is also in torch's weights-only allowlist
#: (checked when the table is made); any other global sends the whole
#: pickle to torch's weights-only unpickler.
_FAST_GLOBALS = ["collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
                 "torch._utils._rebuild_parameter", "torch.storage.UntypedStorage"] + [
    "torch.%sStorage" % k for k in ("Float", "Double", "Half", "BFloat16", "Long", "Int",
                                    "Short", "Char", "Byte", "Bool", "ComplexFloat",
                                    "ComplexDouble")]
_fast_table = None


class _NotFast(Exception):
    pass


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
                       backward_hooks, metadata=None):
    """torch._utils._rebuild_tensor_v2 without its last step, which asks
    for an active fake tensor mode per tensor (the fast unpickler runs only
    when none is active)."""
    tensor = torch._utils._rebuild_tensor(storage, storage_offset, size, stride)
    tensor.requires_grad = requires_grad
    if metadata:
        torch._utils.set_tensor_metadata(tensor, metadata)
    tensor._backward_hooks = backward_hooks
    return tensor


def _fast_globals():
    global _fast_table
    if _fast_table is None:
        from torch import _weights_only_unpickler as wo  # torch-private: looked up when used
        allowed = wo._get_allowed_globals()
        table = {}
        for full in _FAST_GLOBALS:
            fn = allowed.get(full)
            if fn is not None:
                if fn is torch._utils._rebuild_tensor_v2:
                    fn = _rebuild_tensor_v2
                mod, _, name = full.rpartition(".")
                table[(mod, name)] = _Allowed(fn)
        _fast_table = table
    return _fast_table


class _FastUnpickler(pickle.Unpickler):
    """Python's C unpickler restricted to a handful of globals (the
    "restricting globals" pattern of the pickle documentation). That alone
    is weaker than torch's weights-only unpickler (EXT opcodes, the memo,
    SETITEM or BUILD on any object): it runs only on pickles _scan admitted."""

    def find_class(self, module, name):
        fn = self._table.get((module, name))
        if fn is None:
            raise _NotFast("%s.%s" % (module, name))
        return fn


#: The role of each fast global for the pre-scan (_nvio.pickle_scan).
_ROLE_ODICT, _ROLE_TENSOR, _ROLE_STORAGE = 1, 2, 3


def _scan(data):
    """(fast, keys) of a data.pkl (_nvio.pickle_scan): whether the fast
    unpickler may read it, and the storage keys it references."""
    roles = {}
    for mod, name in _fast_globals():
        full = mod + "." + name
        role = (_ROLE_ODICT if full == "collections.OrderedDict" else
                _ROLE_TENSOR if full.startswith("torch._utils._rebuild_") else _ROLE_STORAGE)
        roles[(mod + "\n" + name).encode("utf-8")] = role
    return _nvio.pickle_scan(data, roles)


def _load_weights_only(data, reader, fast):
    """Unpickle a weights-only checkpoint's data.pkl: by the fast
    unpickler when the pre-scan (_scan) admitted it, that is when it is
    made of what torch.save writes for dense tensors and state dicts,
    under rules at least as strict as torch's weights-only unpickler (no
    Python loop over the pickle's opcodes: ~10 us per tensor instead of
    ~50); else, or on any doubt (an error of the fast path, a fake tensor
    mode active), by torch's weights-only unpickler from the start, which
    gives torch's verdict. Storages the fast path made are reused (the
    reader caches them by key), so nothing is read twice."""
    if fast and torch._guards.detect_fake_mode(None) is None:
        up = _FastUnpickler(io.BytesIO(data), encoding="utf-8")
        up._table = _fast_globals()
        up.persistent_load = reader
        try:
            return up.load()
        except CheckpointError:
            raise
        except Exception:           # noqa: BLE001 - torch's unpickler decides
            pass
    # its globals may rebuild from tensor data (a nested tensor's sizes)
    reader.settle()
    up = _unpickler(data, True)
    up.persistent_load = reader
    return up.load()


def _unpickler(data, weights_only):
    if weights_only:
        from torch import _weights_only_unpickler  # torch-private: looked up when used
        return _weights_only_unpickler.Unpickler(io.BytesIO(data), encoding="utf-8")

    class _Full(pickle.Unpickler):
        def find_class(self, mod, name):
            if type(name) is str and "Storage" in name:
                try:
                    return torch.serialization.StorageType(name)
                except KeyError:
                    pass
            mod = {"torch.tensor": "torch._tensor"}.get(mod, mod)
            return super().find_class(mod, name)
    return _Full(io.BytesIO(data), encoding="utf-8")


def _torch_load(path, map_location, weights_only, mmap):
    return torch.load(path, map_location=map_location, weights_only=weights_only, mmap=mmap)


def load(f, map_location=None, weights_only=True, mmap=False, *, handle=None,
         pin_memory=False, verify=False, group=None, share="auto"):
    """Load what ``torch.save`` or :func:`nvio.save` wrote, like ``torch.load``.

    Reads files of both (torch's zip format; a legacy-format or TorchScript
    file is handed to ``torch.load``). Tensor data is read in parallel by
    libnvio straight into the final tensors' memory: page-aligned host
    memory (page-locked with ``pin_memory=True``), or the GPU ``map_location``
    names (a device, a string, a dict of locations, or a callable as for
    torch.load). ``weights_only=True`` (the default) runs no arbitrary
    pickle code; ``weights_only=False`` trusts the file and reads each storage
    as the unpickler asks for it. ``mmap=True`` is ``torch.load(mmap=True)``
    (``pin_memory`` and ``verify`` cannot go with it: ValueError).
    ``verify=True`` checks every record's CRC-32 too. ``f`` that is a file
    object is passed to ``torch.load``. A path that is no regular file (a
    FIFO, a device, a directory) raises CheckpointError at once.

    One difference from ``torch.load`` to know: with
    ``weights_only=True``, the host tensors of a checkpoint whose
    records lie densely in the file (nvio's and torch.save's) are read
    with one read into ONE allocation, of which every storage is a slice:
    that allocation is freed when the last tensor from it is. Keeping a
    few tensors of a checkpoint (the model of a training checkpoint, say)
    keeps the whole allocation: copy (``.clone()``) what you keep, or
    load the parts from separate files. Records the pickle does not
    reference are never read.

    ``weights_only=True`` refuses exactly what torch's weights-only
    unpickler refuses (the same globals, opcodes and rules): a one-pass
    scan admits to a faster unpickler only pickles made of what torch.save
    writes for dense tensors and state dicts, under those rules, and hands
    every other pickle to torch's unpickler.

    ``group`` (a torch.distributed process group; every rank calls load):
    with ``share=True`` each rank reads an equal share of the tensor bytes
    and broadcasts it to the others, so the file is read once in all; with
    ``share=False`` every rank reads the whole file. ``share="auto"`` (the
    default) reads the whole file on every rank when all ranks of the group
    run on one host (they share its storage, and a broadcast between them
    copies every byte through the backend: on a 2-core VM with gloo, 2
    ranks loaded a 0.7 GB state at 0.28 GB/s sharing against 1.26 GB/s
    each reading it all, bench/results/dp-2026-11-25c.md) and shares
    otherwise (each host's storage is read once per share).
    """
    if not isinstance(f, (str, bytes, os.PathLike)):
        return torch.load(f, map_location=map_location, weights_only=weights_only, mmap=mmap)
    kw = dict(map_location=map_location, weights_only=weights_only, mmap=mmap,
              handle=handle, pin_memory=pin_memory, verify=verify)
    if group is not None:
        if share != "auto":
            share = _nvio.check_flag(share, "share")
        return load_group(load_plain, f, group, share=share, **kw)
    return load_plain(f, **kw)


def load_plain(f, map_location=None, weights_only=True, mmap=False, handle=None,
               pin_memory=False, verify=False, _read_all=None):
    """load() on one process; _read_all(file, reads) replaces the one
    vectored read of every storage (data-parallel loads share it out)."""
    weights_only = _nvio.check_flag(weights_only, "weights_only")
    pin = _nvio.check_flag(pin_memory, "pin_memory")
    verify = _nvio.check_flag(verify, "verify")
    path = os.fsdecode(f)
    # a FIFO or a device would block the open or the reads: refused here
    # (a file swapped for one between this check and the open below is not)
    os.close(_zip.open_regular(path, lambda msg: CheckpointError("nvio.load: " + msg, path)))
    if _nvio.check_flag(mmap, "mmap"):
        if pin or verify:
            raise ValueError("nvio.load: %s: mmap=True maps the file as it is: pin_memory "
                             "and verify cannot go with it" % path)
        return _torch_load(path, map_location, weights_only, True)
    if handle is None:
        handle = default_handle()
    args = (path, map_location, weights_only, handle, pin, verify, _read_all)
    lazy = weights_only and _read_all is None
    # the directory's entries, the pickle's objects, a tensor per storage:
    # thousands of containers, and full collections walking the process
    with gc_paused():
        try:
            return _load_plain(*args, lazy=lazy)
        except (_Mispredicted, CheckpointError):
            if not lazy:
                raise
        # a tensor record not where the archive's alignment puts it (a zip
        # writer other than torch's and nvio's), or a bad file: again, reading
        # every local header (a bad file gives its error from here)
        return _load_plain(*args, lazy=False)


def _load_plain(path, map_location, weights_only, handle, pin, verify, _read_all, lazy):
    with handle.open(path, _nvio.FILE_READ) as nf:
        ix = open_index(nf, path, lazy=lazy)
        if ix is None and not _legacy_magic(nf):
            raise _err(path, "not a torch checkpoint (neither torch's zip format "
                       "nor its legacy pickle format)")
        if ix is None or ix.has("constants.pkl"):
            nf.close()
            return _torch_load(path, map_location, weights_only, False)
        _check_versions(ix)
        order = ix.record("byteorder").decode("ascii", "replace") if ix.has("byteorder") \
            else sys.byteorder
        if order not in ("little", "big"):
            raise _err(path, "the byteorder record holds %r, neither 'little' nor 'big': "
                       "the file is corrupt" % order[:40])
        if order != sys.byteorder:
            nf.close()
            return _torch_load(path, map_location, weights_only, False)
        pkl = ix.record("data.pkl", limit=None)
        fast = False
        if weights_only:
            fast, keys = _scan(pkl)
            ix.reference(keys)
        # weights_only: no code runs during unpickling that could look at
        # tensor bytes, so every record the pickle references is read while
        # the pickle is parsed (others, asked for by a pickle the scan lost
        # track of, are read one by one as the unpickler asks)
        span = _Span(nf, ix, pin) if (weights_only and _read_all is None
                                      and _Span.worth(ix)) else None
        if span is None:
            settle(ix)                  # exact offsets, from the local headers
        reader = _Reader(ix, map_location, pin, eager=not weights_only, span=span)
        tls = getattr(torch.serialization, "_serialization_tls", None)
        if tls is not None:
            tls.map_location = map_location
        unpickled = False
        try:
            if weights_only:
                result = _load_weights_only(pkl, reader, fast)
            else:
                up = _unpickler(pkl, weights_only)
                up.persistent_load = reader
                result = up.load()
            unpickled = True
        except CheckpointError:
            raise
        except pickle.UnpicklingError as e:
            if weights_only:
                raise pickle.UnpicklingError(
                    "nvio.load: %s: weights_only=True refused the file: %s\nLoad it "
                    "with weights_only=False only if you trust where it came from."
                    % (path, e)) from None
            raise
        except _UNPICKLE_ERRORS as e:
            raise _err(path, "cannot unpickle data.pkl (%s: %s): the file may be corrupt"
                       % (type(e).__name__, e)) from e
        finally:
            if tls is not None:
                tls.map_location = None
            if span is not None:
                try:
                    span.wait()         # also on an error: the region is busy until then
                except Exception:           # noqa: BLE001
                    if unpickled:       # else the unpickling error goes on
                        raise
        reader.check_sizes()
        if span is not None:
            check_predicted(ix, span)   # before any storage is handed out
        if not reader.eager:
            reads = sorted(reader.reads, key=lambda r: r[1].data_offset)
            if _read_all is not None:
                _read_all(nf, reads)
            else:
                _read_pieces(nf, [(u8(s), e.data_offset) for s, e in reads if e.size])
        if verify:
            _verify_reads(path, reader.spanned + reader.reads)
    torch._utils._validate_loaded_sparse_tensors()
    return result


def _legacy_magic(f):
    """Whether a file that is no zip starts as torch's legacy format does:
    a pickle (protocol 2 or later) of its magic number."""
    b = bytearray(2)
    if f.size < 2:
        return False
    f.pread(b, 0)
    return b[0] == 0x80 and 2 <= b[1] <= 5


def _check_versions(ix):
    if ix.has(NVIO_RECORD):
        try:
            v = int(ix.record(NVIO_RECORD))
        except ValueError:
            raise _err(ix.path, "corrupt %s record" % NVIO_RECORD) from None
        if v > NVIO_FORMAT:
            raise _err(ix.path, "written by a newer nvio (layout version %d; this "
                       "nvio %s reads up to %d): upgrade nvio" % (v, _nvio.version_string,
                                                                 NVIO_FORMAT))


def _verify_reads(path, reads):
    host = [(_device.to_host(s), e) for s, e in reads]
    crcs = crc_submit([(s.data_ptr(), e.size) for s, e in host])()
    for (s, e), crc in zip(host, crcs):
        if crc != e.crc:
            raise _err(path, "record %s: CRC-32 mismatch (stored %08x, data %08x): "
                       "the file is corrupt" % (e.name, e.crc, crc))
