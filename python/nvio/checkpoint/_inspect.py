"""What a checkpoint holds and whether it is intact: ``info`` and ``verify``.

Both read torch's zip checkpoints, nvio's and plain ``torch.save``'s, with
the parsers of :mod:`nvio._base.torchzip` (end records, central directory, local headers)
and plain ``pread``; neither runs code from the file. The pickle is
unpickled by torch's weights-only unpickler with every storage on the meta
device, so tensors show their dtype, shape and key path without a byte of
tensor data being read or allocated.

``info(path)`` returns a dict (what ``--json`` prints): the file, its
records (name, data offset and its alignment, size, CRC-32) and its tensors
(key path, dtype, shape, the storage's record, whether other tensors share
the storage). ``verify(path)`` returns a report whose ``problems`` name the
record and offset of everything wrong: a record's CRC-32 that does not match
the central directory, sizes that disagree (directory, local header, data
descriptor, the pickle's storage sizes), records that overlap or run past
the end of the file, a corrupt directory or pickle.
"""
from __future__ import annotations

import io
import os
import pickle
import pickletools
import struct
import sys
import zlib

from .. import _nvio
from .._base import torchzip as _zip
from .._base.handle import default_handle
from .._base.plan import NVIO_FORMAT, NVIO_RECORD

# libnvio's CRC-32 (several times zlib's speed where the CPU has carry-less
# multiplication); zlib's where this build lacks it
_crc32 = getattr(_nvio, "crc32", zlib.crc32)

__all__ = ["info", "verify", "open_archive", "Archive", "LegacyFormat", "NotACheckpoint"]

#: Bytes read at a time when computing CRC-32s.
CHUNK = 16 << 20
#: Tensors that cannot be rebuilt on the meta device (quantized, nested) are
#: rebuilt in host memory, read from the file, when all storages together are
#: at most this big; otherwise info lists the records only.
HOST_REBUILD_MAX = 256 << 20
#: A data.pkl larger than this is refused (the pickle is small: tensor data
#: lives in other records).
MAX_PICKLE = 1 << 30
#: The largest metadata record (version, byteorder, nvio's format) read as
#: text: such records hold a few bytes.
TEXT_MAX = 4096


class NotACheckpoint(ValueError):
    """The file cannot be read as a torch checkpoint (the message says why)."""


class LegacyFormat(NotACheckpoint):
    """The file is torch's legacy (pre-1.6, non-zip) format."""


def _align_of(off):
    """The largest power of two dividing off (0 for offset 0)."""
    return off & -off if off else 0


class Archive:
    """A zip checkpoint's directory: ``entries`` in directory order, each a
    _zip.Entry with ``data_offset`` set (-1 where its local header is bad;
    ``local_errors`` says why) plus ``local_flags``/``local_extra``."""

    def __init__(self, path, fd, size):
        self.path = path
        self.fd = fd
        self.size = size
        self.entries = []
        self.by_name = {}
        self.prefix = ""
        self.cd_offset = self.cd_size = 0
        self.local_errors = {}

    def pread(self, n, off):
        b = os.pread(self.fd, n, off)
        if len(b) != n:
            raise NotACheckpoint("%s: %d bytes at offset %d: only %d could be read "
                                 "(the file is truncated)" % (self.path, n, off, len(b)))
        return b

    def record(self, name):
        """A small record's bytes (name without the archive prefix)."""
        e = self.by_name[self.prefix + name]
        if e.data_offset < 0 or e.data_offset + e.size > self.size:
            raise NotACheckpoint("%s: record %s lies past the end of the file"
                                 % (self.path, e.name))
        return self.pread(e.size, e.data_offset)

    def has(self, name):
        return self.prefix + name in self.by_name

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def open_archive(path):
    """Parse a zip checkpoint's directory and local headers.

    Raises LegacyFormat for torch's legacy format, NotACheckpoint for
    anything else that is no zip archive or whose directory is unreadable,
    OSError for files that cannot be read."""
    path = os.fsdecode(path)
    fd = _zip.open_regular(path, NotACheckpoint)
    try:
        size = os.fstat(fd).st_size
        ar = Archive(path, fd, size)
        _read_directory(ar)
        return ar
    except BaseException:
        os.close(fd)
        raise


def _read_directory(ar):
    path, size = ar.path, ar.size
    if size == 0:
        raise NotACheckpoint("%s: the file is empty" % path)
    head = os.pread(ar.fd, 4, 0)
    n = min(size, _zip.TAIL_BYTES)
    tail = ar.pread(n, size - n)
    if head != b"PK\x03\x04" and tail.rfind(struct.pack("<I", _zip.EOCD_SIG)) < 0:
        if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
            raise LegacyFormat(
                "%s: torch's legacy format (torch.save with "
                "_use_new_zipfile_serialization=False, or torch before 1.6): it has no "
                "records, offsets or CRC-32s to inspect. torch.load reads it; save it "
                "again with torch.save or nvio.save to get the zip format." % path)
        raise NotACheckpoint("%s: not a torch checkpoint (no zip archive, no legacy "
                             "pickle)" % path)
    # (a zip whose first bytes are damaged is still read: verify names the
    # record whose local header is bad)
    try:
        cd_off, cd_size, count = _zip.find_directory(tail, size - n, size)
        entries = _zip.parse_directory(ar.pread(cd_size, cd_off), count)
    except _zip.ZipFormatError as e:
        raise NotACheckpoint("%s: central directory: %s" % (path, e)) from None
    ar.cd_offset, ar.cd_size = cd_off, cd_size
    for e in entries:
        e.local_flags = 0
        e.local_extra = b""
        ar.entries.append(e)
        ar.by_name[e.name] = e
        _read_local(ar, e)
    pkl = [e.name for e in entries if e.name == "data.pkl" or e.name.endswith("/data.pkl")]
    if not pkl:
        raise NotACheckpoint("%s: a zip archive without a data.pkl record: not a torch "
                             "checkpoint" % path)
    ar.prefix = pkl[0][:-len("data.pkl")]


def _read_local(ar, e):
    """Set e.data_offset from its local header, or note what is wrong."""
    if e.header_offset + _zip.LOCAL_SIZE > ar.size:
        ar.local_errors[e.name] = ("local header at offset %d lies past the end of the "
                                   "file (%d bytes): truncated" % (e.header_offset, ar.size))
        return
    fixed = ar.pread(_zip.LOCAL_SIZE, e.header_offset)
    try:
        e.data_offset = _zip.data_offset(e, fixed)
    except _zip.ZipFormatError as err:
        ar.local_errors[e.name] = "%s (no local header signature)" % err
        return
    (_, _, flags, method, _, _, crc, csize, usize, nlen, xlen) = struct.unpack_from(
        "<IHHHHHIIIHH", fixed)
    e.local_flags = flags
    e.local_method = method
    e.local_sizes = (crc, csize, usize)
    if e.data_offset > ar.size:     # the header's name and extra fields end there
        ar.local_errors[e.name] = ("local header at offset %d runs past the end of the "
                                   "file: truncated" % e.header_offset)
        return
    rest = ar.pread(nlen + xlen, e.header_offset + _zip.LOCAL_SIZE)
    e.local_name = rest[:nlen]
    e.local_extra = rest[nlen:]


# --- the pickle ----------------------------------------------------------------


class _MetaStorages:
    """persistent_load that gives every storage on the meta device (or, with
    device="cpu", zero-filled host memory: for tensor kinds that cannot be
    rebuilt on meta, such as quantized and nested ones) and keeps what each
    persistent id said."""

    def __init__(self, device="meta", read=None):
        import torch    # `python -m nvio.checkpoint info` starts without torch until here
        self.torch = torch
        self.device = device
        self.read = read           # key, nbytes -> bytes (host rebuilds)
        self.storages = {}     # key -> (TypedStorage, dtype, numel, location)
        self.by_cdata = {}     # untyped storage _cdata -> key

    def __call__(self, saved_id):
        torch = self.torch
        if not isinstance(saved_id, tuple) or len(saved_id) != 5:
            raise pickle.UnpicklingError("bad persistent id %r" % (saved_id,))
        typename, stype, key, location, numel = saved_id
        if isinstance(typename, bytes):
            typename = typename.decode("ascii")
        if typename != "storage":
            raise pickle.UnpicklingError("unknown persistent id type %r" % (typename,))
        if isinstance(location, bytes):
            location = location.decode("ascii")
        key = str(key)
        if key in self.storages:
            return self.storages[key][0]
        dtype = torch.uint8 if stype is torch.UntypedStorage else stype.dtype
        if not isinstance(numel, int) or numel < 0:
            raise pickle.UnpicklingError("storage %s: bad element count %r" % (key, numel))
        nbytes = numel * torch._utils._element_size(dtype)
        if self.read is not None:
            b = self.read(key, nbytes)
            s = torch.frombuffer(bytearray(b), dtype=torch.uint8).untyped_storage() \
                if nbytes else torch.UntypedStorage(0)
        else:
            s = torch.UntypedStorage(nbytes, device=self.device)
        ts = torch.storage.TypedStorage(wrap_storage=s, dtype=dtype, _internal=True)
        self.storages[key] = (ts, dtype, numel, location)
        self.by_cdata[s._cdata] = key
        return ts


def _unpickle_meta(data, read=None):
    """(object, _MetaStorages) of a data.pkl unpickled with weights_only=True
    and storages on the meta device; raises pickle.UnpicklingError (refused
    by weights_only, or corrupt) and others for corrupt pickles.

    Tensor kinds that cannot be rebuilt on meta (quantized, nested) are
    rebuilt once more on host storages filled by read(key, nbytes), if
    given."""
    from torch import _weights_only_unpickler  # torch-private: looked up when used

    def run(device):
        ms = _MetaStorages(device, read if device == "cpu" else None)
        up = _weights_only_unpickler.Unpickler(io.BytesIO(data), encoding="utf-8")
        up.persistent_load = ms
        return up.load(), ms

    try:
        return run("meta")
    except pickle.UnpicklingError:
        raise
    except Exception:  # noqa: BLE001 - a rebuild that meta cannot do
        if read is None:
            raise
        first = sys.exc_info()[1]
    try:
        return run("cpu")
    except Exception:  # noqa: BLE001
        raise first from None


def _pickle_structure_error(data):
    """None if the pickle's opcodes parse to its STOP (it is well formed, if
    perhaps not weights-only), else what is wrong. Executes nothing."""
    try:
        for op, _, pos in pickletools.genops(data):
            if op.name == "STOP":
                if pos + 1 != len(data):
                    return "%d bytes after the STOP opcode" % (len(data) - pos - 1)
                return None
        return "no STOP opcode: truncated"
    except Exception as e:  # noqa: BLE001 - any parse failure is the answer
        return str(e) or type(e).__name__


def _host_reader(ar):
    """read(key, nbytes) of storages for a rebuild in host memory (see
    _unpickle_meta), or None when the storages are too big for that."""
    if sum(e.size for e in ar.entries if e.name.startswith(ar.prefix + "data/")) \
            > HOST_REBUILD_MAX:
        return None

    def read(key, nbytes):
        e = ar.by_name.get(ar.prefix + "data/" + key)
        if e is None or e.size != nbytes:
            raise pickle.UnpicklingError("storage %s: no record of %d bytes" % (key, nbytes))
        return ar.record("data/" + key)
    return read


def _walk(obj, path, out, seen):
    """(path list, tensor) of every tensor reachable through dicts, lists,
    tuples, sets and plain objects' attributes, depth first. Iterative, and
    each path built only for what is found: a pickle may nest containers
    hundreds of thousands deep (torch's unpickler builds them without
    recursion), which recursion or a path copy per level cannot walk."""
    torch = __import__("torch")
    todo = [(obj, None)]        # (object, its path as a chain (parent chain, key))

    def full(chain):
        keys = []
        while chain is not None:
            chain, k = chain
            keys.append(k)
        return path + keys[::-1]

    while todo:
        obj, chain = todo.pop()
        if isinstance(obj, torch.Tensor):
            parts = _parts(obj)
            if parts is None:
                out.append((full(chain), obj))
            else:                       # sparse: its index and value tensors
                for name, t in parts:
                    out.append((full(chain) + [name], t))
            continue
        if isinstance(obj, (torch.storage.TypedStorage, torch.UntypedStorage)):
            out.append((full(chain), obj))     # a storage saved as such
            continue
        if id(obj) in seen:
            continue
        if isinstance(obj, dict):
            items = [(k if isinstance(k, (str, int)) else repr(k), v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            items = list(enumerate(obj))
        elif isinstance(obj, (set, frozenset)):
            items = list(enumerate(sorted(obj, key=repr)))
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            items = list(vars(obj).items())
        else:
            continue
        seen.add(id(obj))
        for k, v in reversed(items):
            todo.append((v, (chain, k)))


def _parts(t):
    """The dense tensors of a tensor without a storage of its own (sparse and
    jagged layouts), as (name, tensor); None for others."""
    torch = __import__("torch")
    if t.layout == torch.strided:
        return None
    if t.layout == torch.sparse_coo:
        return [("indices", t._indices()), ("values", t._values())]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [("crow_indices", t.crow_indices()), ("col_indices", t.col_indices()),
                ("values", t.values())]
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return [("ccol_indices", t.ccol_indices()), ("row_indices", t.row_indices()),
                ("values", t.values())]
    if t.layout == getattr(torch, "jagged", None):
        return [("values", t.values()), ("offsets", t.offsets())]
    return None


def _describe(t):
    """(dtype, shape, stride, storage_offset, nbytes, untyped storage) of a
    tensor or of a storage saved on its own."""
    torch = __import__("torch")
    if isinstance(t, torch.UntypedStorage):
        return torch.uint8, [t.nbytes()], [1], 0, t.nbytes(), t, False
    if isinstance(t, torch.storage.TypedStorage):
        u = t._untyped_storage
        return t.dtype, [t._size()], [1], 0, u.nbytes(), u, False
    # nested tensors have no single shape or stride: None where torch has none
    return (t.dtype, _try(lambda: list(t.shape)), _try(lambda: list(t.stride())),
            _try(t.storage_offset), _try(lambda: t.numel() * t.element_size()),
            _try(t.untyped_storage), bool(t.requires_grad))


def _try(fn):
    try:
        return fn()
    except (RuntimeError, NotImplementedError):
        return None


def key_string(path):
    """A key path as text: keys joined by '/' ('' for the object itself)."""
    return "/".join(str(k) for k in path)


# --- info ----------------------------------------------------------------------


def _text(ar, name):
    """A small metadata record's text; None if absent or unreadable, a note
    if it is larger than such a record can be (TEXT_MAX)."""
    e = ar.by_name.get(ar.prefix + name)
    if e is not None and e.size > TEXT_MAX:
        return "(%d bytes: more than the %d of a metadata record)" % (e.size, TEXT_MAX)
    try:
        return ar.record(name).decode("utf-8", "replace").strip()
    except (KeyError, NotACheckpoint):
        return None


def _is_number(s):
    """Whether s is a decimal number int() takes (isdigit() alone also
    admits characters such as superscripts that int() refuses)."""
    return s.isascii() and s.isdigit()


def info(path):
    """What a zip checkpoint holds, as a dict; see the module's docstring.

    Raises LegacyFormat / NotACheckpoint / OSError as open_archive does."""
    with open_archive(path) as ar:
        return _info(ar)


def _info(ar):
    pre = ar.prefix
    nvio_fmt = _text(ar, NVIO_RECORD)
    records = []
    for e in sorted(ar.entries, key=lambda e: e.header_offset):
        records.append({
            "name": e.name, "header_offset": e.header_offset, "offset": e.data_offset,
            "align": _align_of(e.data_offset) if e.data_offset >= 0 else None,
            "size": e.size, "crc32": "%08x" % e.crc,
        })
    out = {
        "path": ar.path, "size": ar.size, "archive": pre.rstrip("/"),
        "writer": "nvio" if nvio_fmt is not None else "torch",
        "nvio_format": int(nvio_fmt) if nvio_fmt and _is_number(nvio_fmt) else nvio_fmt,
        "format_version": _text(ar, ".format_version"),
        "version": _text(ar, "version"),
        "storage_alignment": _text(ar, ".storage_alignment"),
        "byteorder": _text(ar, "byteorder"),
        "records": records, "tensors": [], "storages": [],
        "pickle": None, "pickle_bytes": None,
    }
    if not ar.has("data.pkl"):
        return out
    pe = ar.by_name[pre + "data.pkl"]
    out["pickle_bytes"] = pe.size
    if pe.size > MAX_PICKLE:
        out["pickle"] = "data.pkl is %d bytes, more than the %d this reads" % (pe.size, MAX_PICKLE)
        return out
    try:
        obj, ms = _unpickle_meta(ar.record("data.pkl"), _host_reader(ar))
    except Exception as e:  # noqa: BLE001 - reported, not raised
        bad = _pickle_structure_error(ar.record("data.pkl"))
        out["pickle"] = ("corrupt: %s" % bad) if bad else \
            ("does not load with weights_only=True: %s" % _first_line(e))
        return out
    out["pickle"] = "ok"
    found = []
    _walk(obj, [], found, set())
    users = {}
    described = []
    for p, t in found:
        d = _describe(t)
        key = ms.by_cdata.get(d[5]._cdata) if d[5] is not None else None
        users.setdefault(key, []).append(p)
        described.append((p, d, key))
    for p, (dtype, shape, stride, soff, nbytes, st, grad), key in described:
        e = ar.by_name.get(pre + "data/" + key) if key is not None else None
        out["tensors"].append({
            "key": key_string(p), "path": p,
            "dtype": str(dtype).replace("torch.", ""), "shape": shape,
            "stride": stride, "storage_offset": soff, "nbytes": nbytes,
            "storage": key, "storage_bytes": st.nbytes() if st is not None else None,
            "record": e.name if e is not None else None,
            "offset": e.data_offset if e is not None else None,
            "align": _align_of(e.data_offset) if e is not None and e.data_offset >= 0 else None,
            "shared": len(users.get(key, ())) > 1,
            "requires_grad": grad,
        })
    for key, (_, dtype, numel, loc) in ms.storages.items():
        e = ar.by_name.get(pre + "data/" + key)
        out["storages"].append({
            "key": key, "dtype": str(dtype).replace("torch.", ""), "numel": numel,
            "location": loc, "record": e.name if e is not None else None,
            "bytes": e.size if e is not None else None,
            "users": [key_string(p) for p in users.get(key, [])],
        })
    return out


def _first_line(e):
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


# --- verify ----------------------------------------------------------------------


class _Report:
    def __init__(self, path):
        self.path = path
        self.problems = []     # {"record", "offset", "message"}
        self.warnings = []
        self.records = 0
        self.bytes = 0
        self.legacy = False

    def bad(self, record, offset, message):
        self.problems.append({"record": record, "offset": offset, "message": message})

    def as_dict(self):
        return {"path": self.path, "ok": not self.problems,
                "status": "legacy" if self.legacy else "ok" if not self.problems else "corrupt",
                "problems": self.problems,
                "warnings": self.warnings, "records_checked": self.records,
                "bytes_checked": self.bytes}


def verify(path, progress=None):
    """Check a zip checkpoint completely; a dict with ``ok``, ``problems``
    (each naming the record and file offset), ``warnings``, and what was
    checked. ``progress(done_bytes, total_bytes)`` is called as data is read.

    A file that is no zip checkpoint at all (legacy format, no archive, an
    unreadable directory) is one problem, record None; ``status`` is "ok",
    "corrupt", or "legacy" (torch's legacy format, which has nothing to check
    against)."""
    rep = _Report(os.fsdecode(path))
    try:
        ar = open_archive(path)
    except LegacyFormat as e:
        rep.legacy = True
        rep.bad(None, None, str(e))
        return rep.as_dict()
    except NotACheckpoint as e:
        rep.bad(None, None, str(e))
        return rep.as_dict()
    except OSError as e:
        rep.bad(None, None, "%s: cannot read: %s" % (rep.path, e.strerror or e))
        return rep.as_dict()
    with ar:
        _verify(ar, rep, progress)
    return rep.as_dict()


def _verify(ar, rep, progress):
    reader = _Reader(ar)
    try:
        _verify_records(ar, rep, progress, reader)
    finally:
        reader.close()
    _check_overlaps(ar, rep)
    _check_contents(ar, rep)


def _verify_records(ar, rep, progress, reader):
    total = sum(e.size for e in ar.entries)
    done = 0
    for e in ar.entries:
        msg = ar.local_errors.get(e.name)
        if msg is not None:
            rep.bad(e.name, e.header_offset, msg)
            continue
        _check_local(ar, e, rep)
        if e.method != 0 or e.compressed != e.size:
            rep.bad(e.name, e.header_offset, "compressed (method %d, %d bytes for %d): torch "
                    "checkpoints store records uncompressed" % (e.method, e.compressed, e.size))
            continue
        if e.data_offset + e.size > ar.size:
            rep.bad(e.name, e.data_offset, "%d bytes of data at offset %d run past the end of "
                    "the file (%d bytes): truncated" % (e.size, e.data_offset, ar.size))
            continue
        try:
            crc = reader.crc(e.data_offset, e.size,
                             lambda n: progress and progress(done + n, total))
        except OSError as err:
            rep.bad(e.name, e.data_offset, "reading %d bytes of data at offset %d failed: %s"
                    % (e.size, e.data_offset, err.strerror or err))
            continue
        done += e.size
        rep.records += 1
        rep.bytes += e.size
        if crc != e.crc:
            rep.bad(e.name, e.data_offset, "CRC-32 mismatch in %d bytes of data at offset %d: "
                    "the central directory says %08x, the data gives %08x"
                    % (e.size, e.data_offset, e.crc, crc))
        _check_descriptor(ar, e, rep)


def _check_local(ar, e, rep):
    if getattr(e, "local_name", None) is not None and \
            e.local_name.decode("utf-8", "replace") != e.name:
        rep.bad(e.name, e.header_offset, "the local header at offset %d names %r, the "
                "central directory %r" % (e.header_offset,
                                          e.local_name.decode("utf-8", "replace"), e.name))
    if e.local_method != e.method:
        rep.bad(e.name, e.header_offset, "the local header at offset %d says compression "
                "method %d, the central directory %d" % (e.header_offset, e.local_method,
                                                         e.method))
    if e.local_flags & _zip.FLAG_DESCRIPTOR:
        # sizes follow the data; the header's fields are zero (0xFFFFFFFF
        # for zip64 sizes) or, from some writers, already the right values
        crc, csize, usize = e.local_sizes
        if crc not in (0, e.crc) or usize not in (0, 0xFFFFFFFF, e.size) or \
                csize not in (0, 0xFFFFFFFF, e.compressed):
            rep.bad(e.name, e.header_offset, "the local header at offset %d says CRC-32 %08x, "
                    "%d bytes, where a record with a data descriptor has zeros or the "
                    "central directory's %08x, %d bytes"
                    % (e.header_offset, crc, usize, e.crc, e.size))
    else:
        crc, csize, usize = e.local_sizes
        z64 = _zip64_sizes(e.local_extra)
        if usize == 0xFFFFFFFF and z64:
            usize, csize = z64
        if crc != e.crc or usize != e.size or csize != e.compressed:
            rep.bad(e.name, e.header_offset, "the local header at offset %d says CRC-32 %08x, "
                    "%d bytes; the central directory %08x, %d bytes"
                    % (e.header_offset, crc, usize, e.crc, e.size))


def _zip64_sizes(extra):
    q = 0
    while q + 4 <= len(extra):
        hid, hlen = struct.unpack_from("<HH", extra, q)
        if hid == _zip.ZIP64_EXTRA_ID and hlen >= 16 and q + 20 <= len(extra):
            return struct.unpack_from("<QQ", extra, q + 4)
        q += 4 + hlen
    return None


def _descriptor(ar, e):
    """(offset, crc, compressed, size, length) of e's data descriptor, or
    a string saying what is wrong."""
    off = e.data_offset + e.size
    z64 = _zip64_sizes(e.local_extra) is not None
    n = 24 if z64 else 16
    if off + n > ar.size:
        n = 20 if z64 else 12                  # without the optional signature
        if off + n > ar.size:
            return "the data descriptor at offset %d lies past the end of the file" % off
    b = ar.pread(n, off)
    if struct.unpack_from("<I", b)[0] == _zip.DESCRIPTOR_SIG:
        b = b[4:]
        length = 4
    else:
        length = 0
    if z64:
        crc, csize, usize = struct.unpack_from("<IQQ", b)
        length += 20
    else:
        crc, csize, usize = struct.unpack_from("<III", b)
        length += 12
    return off, crc, csize, usize, length


def _check_descriptor(ar, e, rep):
    if not e.local_flags & _zip.FLAG_DESCRIPTOR:
        e.end = e.data_offset + e.size
        return
    d = _descriptor(ar, e)
    if isinstance(d, str):
        rep.bad(e.name, e.data_offset + e.size, d)
        e.end = e.data_offset + e.size
        return
    off, crc, csize, usize, length = d
    e.end = off + length
    if crc != e.crc or usize != e.size or csize != e.compressed:
        rep.bad(e.name, off, "the data descriptor at offset %d says CRC-32 %08x, %d bytes; the "
                "central directory %08x, %d bytes" % (off, crc, usize, e.crc, e.size))


def _check_overlaps(ar, rep):
    ents = sorted((e for e in ar.entries if hasattr(e, "end")), key=lambda e: e.header_offset)
    for a, b in zip(ents, ents[1:]):
        if a.end > b.header_offset:
            rep.bad(b.name, b.header_offset, "the record's local header at offset %d overlaps "
                    "record %s (which ends at offset %d)" % (b.header_offset, a.name, a.end))
    if ents and ents[-1].end > ar.cd_offset:
        e = ents[-1]
        rep.bad(e.name, e.header_offset, "the record (ending at offset %d) overlaps the "
                "central directory at offset %d" % (e.end, ar.cd_offset))


class _Reader:
    """Reads records for their CRC-32: through libnvio (direct I/O, the next
    chunk read while this one is checked) where it can open the file, with
    pread otherwise. Two chunk buffers, allocated once."""

    def __init__(self, ar):
        self.ar = ar
        self.file = None
        try:
            self.file = default_handle().open(ar.path, _nvio.FILE_READ)
            self.bufs = [memoryview(_nvio.LockedBuffer(CHUNK)) for _ in range(2)]
        except (OSError, MemoryError):
            if self.file is not None:
                self.file.close()
            self.file = None
            self.bufs = [memoryview(bytearray(CHUNK))]

    def close(self):
        if self.file is not None:
            self.file.close()
            self.file = None

    def crc(self, off, n, progress):
        """CRC-32 of n bytes at off (of fewer where the file ends early)."""
        if self.file is None:
            return self._crc_pread(off, n, progress)
        crc, pos, i = 0, 0, 0
        k = min(CHUNK, n)
        fut = self.file.pread_async(self.bufs[0][:k], off) if k else None
        while fut is not None:
            got = fut.result()
            fut = None
            nxt = pos + got
            if got == k and nxt < n:            # read the next chunk meanwhile
                k2 = min(CHUNK, n - nxt)
                fut = self.file.pread_async(self.bufs[1 - i][:k2], off + nxt)
            crc = _crc32(self.bufs[i][:got], crc)
            pos, i, k = nxt, 1 - i, (k2 if fut is not None else 0)
            if progress:
                progress(pos)
        return crc

    def _crc_pread(self, off, n, progress):
        crc, pos, mv = 0, 0, self.bufs[0]
        while pos < n:
            got = os.preadv(self.ar.fd, [mv[:min(CHUNK, n - pos)]], off + pos)
            if got <= 0:
                break                 # truncated: the size check said so already
            crc = _crc32(mv[:got], crc)
            pos += got
            if progress:
                progress(pos)
        return crc


def _check_contents(ar, rep):
    """The pickle, the storages' records and their sizes, the versions."""
    pre = ar.prefix
    pe = ar.by_name[pre + "data.pkl"]
    fmt = _text(ar, NVIO_RECORD) if pre + NVIO_RECORD not in ar.local_errors else None
    if fmt is not None:
        if not _is_number(fmt):
            rep.bad(pre + NVIO_RECORD, ar.by_name[pre + NVIO_RECORD].data_offset,
                    "corrupt nvio format record %r" % fmt)
        elif int(fmt) > NVIO_FORMAT:
            rep.warnings.append("written by a newer nvio (layout version %s; this nvio reads "
                                "up to %d)" % (fmt, NVIO_FORMAT))
    if pe.name in ar.local_errors or pe.data_offset + pe.size > ar.size:
        return
    if pe.size > MAX_PICKLE:
        rep.bad(pe.name, pe.data_offset, "data.pkl is %d bytes, more than the %d this reads"
                % (pe.size, MAX_PICKLE))
        return
    data = ar.record("data.pkl")
    try:
        _, ms = _unpickle_meta(data, _host_reader(ar))
    except Exception as e:  # noqa: BLE001 - reported
        bad = _pickle_structure_error(data)
        if bad:
            rep.bad(pe.name, pe.data_offset, "the pickle is corrupt: %s" % bad)
        else:
            rep.warnings.append("data.pkl does not load with weights_only=True (it needs "
                                "torch.load(weights_only=False), which runs code from the "
                                "file): %s" % _first_line(e))
        return
    used = set()
    for key, (_, dtype, numel, _) in ms.storages.items():
        e = ar.by_name.get(pre + "data/" + key)
        need = numel * __import__("torch")._utils._element_size(dtype)
        if e is None:
            rep.bad(pre + "data/" + key, None, "missing: the pickle needs it for a storage of "
                    "%d bytes (%d x %s)" % (need, numel, dtype))
            continue
        used.add(e.name)
        if e.size != need:
            rep.bad(e.name, e.data_offset, "holds %d bytes; the pickle's storage needs %d "
                    "(%d x %s)" % (e.size, need, numel, dtype))
    for e in ar.entries:
        if e.name.startswith(pre + "data/") and e.name not in used:
            rep.warnings.append("record %s is not used by the pickle" % e.name)
