"""The safetensors format, decided without touching a file (and a model directory's files).

A safetensors file is: 8 bytes (little-endian u64) N, N bytes of a JSON
object (``{"__metadata__": {str: str}, name: {"dtype": D, "shape": [..],
"data_offsets": [begin, end]}, ...}``, padded with spaces to a multiple of
8), then the data region, every tensor's bytes at its offsets, row-major,
little-endian, tiling the region with no gap and no overlap.

``parse_header`` validates an untrusted header completely (every limit
named in the error) before anything is allocated or read by it;
``layout`` computes the header bytes and data offsets of a save exactly as
the safetensors library does (tensors sorted by dtype, largest first, then
by name), so that files written from the same tensors are identical.
"""
from __future__ import annotations

import json
import math
import os
import stat

import torch

from .. import _regular

#: The safetensors library refuses headers longer than this (100 MB): so do we.
MAX_HEADER = 100_000_000
#: Most dimensions a tensor may have (a bound on hostile headers; torch
#: makes tensors of this many dimensions, and safetensors has no limit).
MAX_RANK = 1024
#: Largest dimension (torch sizes are int64; a zero-sized tensor may name
#: any other dimension, so the byte-length check alone does not bound them).
MAX_DIM = (1 << 63) - 1
#: Bytes before the header.
PREFIX = 8

try:
    _SafetensorError = __import__("safetensors").SafetensorError
except Exception:           # the safetensors library is optional
    _SafetensorError = None


if _SafetensorError is not None:
    class SafetensorsError(ValueError, _SafetensorError):
        """A safetensors file or call nvio cannot accept; the message names
        the file, the tensor and what is wrong. A ValueError, and also the
        safetensors library's SafetensorError when that is installed, so code
        catching either catches it. ``filename``: the file (or None)."""

        def __init__(self, msg, filename=None):
            ValueError.__init__(self, msg)
            self.filename = filename
else:
    class SafetensorsError(ValueError):
        """A safetensors file or call nvio cannot accept; the message names
        the file, the tensor and what is wrong. ``filename``: the file (or None)."""

        def __init__(self, msg, filename=None):
            super().__init__(msg)
            self.filename = filename

# public as nvio.safetensors.SafetensorsError (defined here, under its readers)
SafetensorsError.__module__ = "nvio.safetensors"


class DType:
    """One safetensors dtype: its code, bits per element, torch dtype (None
    when torch has none) and rank in the save order (bigger first)."""

    __slots__ = ("code", "bits", "torch", "rank")

    def __init__(self, code, bits, torch_name, rank):
        self.code = code
        self.bits = bits
        self.torch = getattr(torch, torch_name, None) if torch_name else None
        self.rank = rank


# In the safetensors library's order (its Dtype enum): a save sorts tensors
# by this, descending, then by name.
_TABLE = [
    ("BOOL", 8, "bool"), ("F4", 4, "float4_e2m1fn_x2"), ("F6_E2M3", 6, None),
    ("F6_E3M2", 6, None), ("U8", 8, "uint8"), ("I8", 8, "int8"),
    ("F8_E5M2", 8, "float8_e5m2"), ("F8_E4M3", 8, "float8_e4m3fn"),
    ("F8_E8M0", 8, "float8_e8m0fnu"), ("F8_E4M3FNUZ", 8, "float8_e4m3fnuz"),
    ("F8_E5M2FNUZ", 8, "float8_e5m2fnuz"), ("I16", 16, "int16"), ("U16", 16, "uint16"),
    ("F16", 16, "float16"), ("BF16", 16, "bfloat16"), ("I32", 32, "int32"),
    ("U32", 32, "uint32"), ("F32", 32, "float32"), ("C64", 64, "complex64"),
    ("F64", 64, "float64"), ("I64", 64, "int64"), ("U64", 64, "uint64"),
]
DTYPES = {code: DType(code, bits, name, i) for i, (code, bits, name) in enumerate(_TABLE)}
BY_TORCH = {d.torch: d for d in DTYPES.values() if d.torch is not None}
#: torch's packed float4 holds two values per element: the header's shape
#: counts values, so its last dimension is twice torch's.
PACKED = {"F4": 2}


class Entry:
    """One tensor of a file: name, dtype, shape (the header's), byte range
    [begin, end) in the data region."""

    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name, dtype, shape, begin, end):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.begin = begin
        self.end = end

    @property
    def nbytes(self):
        return self.end - self.begin

    def torch_shape(self):
        """The shape of the torch tensor (F4: last dimension halved)."""
        k = PACKED.get(self.dtype.code)
        if k is None:
            return tuple(self.shape)
        return tuple(self.shape[:-1]) + (self.shape[-1] // k,)

    def __repr__(self):
        return "Entry(%r, %s, %r, [%d, %d))" % (self.name, self.dtype.code, self.shape,
                                                self.begin, self.end)


class Header:
    """A validated header: entries by name (the file's order), metadata,
    where the data region starts and how long it is."""

    def __init__(self, entries, metadata, header_len):
        self.entries = entries            # name -> Entry
        self.metadata = metadata          # dict or None
        self.data_start = PREFIX + header_len
        self.data_size = sum(e.nbytes for e in entries.values())

    def by_offset(self):
        return sorted(self.entries.values(), key=lambda e: (e.begin, e.end))


def _where(path):
    return "%s: " % path if path is not None else ""


def header_length(prefix, file_size, path=None):
    """N from the first 8 bytes, checked against the limit and the file size."""
    w = _where(path)
    if file_size < PREFIX:
        raise SafetensorsError("nvio.safetensors: %sthe file is %d bytes, shorter than the "
                               "8-byte header length: it is truncated or no safetensors file"
                               % (w, file_size), path)
    n = int.from_bytes(bytes(prefix[:PREFIX]), "little")
    if n > MAX_HEADER:
        raise SafetensorsError("nvio.safetensors: %sheader length %d is over the limit of %d "
                               "bytes: the file is corrupt or no safetensors file"
                               % (w, n, MAX_HEADER), path)
    if PREFIX + n > file_size:
        raise SafetensorsError("nvio.safetensors: %sheader length %d runs past the end of the "
                               "file (%d bytes): the file is truncated" % (w, n, file_size), path)
    if n < 2:
        raise SafetensorsError("nvio.safetensors: %sheader length %d is too short for a JSON "
                               "object" % (w, n), path)
    return n


def _no_dups(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise _Dup(k)
        d[k] = v
    return d


class _Dup(Exception):
    pass


def _bad_constant(name):
    raise ValueError("%s is not JSON" % name)


def _is_uint(v):
    return type(v) is int and v >= 0


def parse_header(raw, file_size, path=None):
    """A Header from the N header bytes of a file of file_size bytes (or of
    a bytes object that long): every tensor checked, the data region tiled
    exactly. SafetensorsError on anything else."""
    w = _where(path)

    def bad(msg, name=None):
        t = "tensor %r: " % name if name is not None else ""
        return SafetensorsError("nvio.safetensors: %s%s%s" % (w, t, msg), path)

    n = len(raw)
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad("the header is not UTF-8 (%s)" % e) from None
    try:
        obj = json.loads(text, object_pairs_hook=_no_dups, parse_constant=_bad_constant)
    except _Dup as e:
        raise bad("the header names %r twice" % (e.args[0],)) from None
    except (ValueError, RecursionError) as e:
        raise bad("the header is not valid JSON (%s)" % str(e)[:200]) from None
    if not isinstance(obj, dict):
        raise bad("the header is a JSON %s, not an object" % type(obj).__name__)
    metadata = obj.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise bad("__metadata__ must map strings to strings")
    entries = {}
    for name, info in obj.items():
        if not isinstance(info, dict):
            raise bad("its header entry is a JSON %s, not an object" % type(info).__name__, name)
        code = info.get("dtype")
        dt = DTYPES.get(code) if isinstance(code, str) else None
        if dt is None:
            raise bad("unknown dtype %r (known: %s)" % (code, ", ".join(DTYPES)), name)
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(_is_uint(s) for s in shape):
            raise bad("shape %r is not a list of non-negative integers" % (shape,), name)
        if len(shape) > MAX_RANK:
            raise bad("%d dimensions, more than the limit of %d" % (len(shape), MAX_RANK), name)
        if any(s > MAX_DIM for s in shape):
            raise bad("shape %r has a dimension over the limit of %d" % (shape, MAX_DIM), name)
        offs = info.get("data_offsets")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(_is_uint(o) for o in offs)
                or offs[0] > offs[1]):
            raise bad("data_offsets %r is not [begin, end] with 0 <= begin <= end" % (offs,), name)
        bits = math.prod(shape) * dt.bits
        if bits % 8:
            raise bad("%s shape %r holds %d bits, not a whole number of bytes"
                      % (code, shape, bits), name)
        if bits // 8 != offs[1] - offs[0]:
            raise bad("%s shape %r needs %d bytes but data_offsets %r hold %d"
                      % (code, shape, bits // 8, offs, offs[1] - offs[0]), name)
        entries[name] = Entry(name, dt, shape, offs[0], offs[1])
    cursor = 0
    for e in sorted(entries.values(), key=lambda e: (e.begin, e.end)):
        if e.begin != cursor:
            what = "overlaps the tensor before it" if e.begin < cursor else \
                "leaves a gap of %d bytes before it" % (e.begin - cursor)
            raise bad("data_offsets [%d, %d] %s (expected begin %d): the data region must be "
                      "tiled exactly" % (e.begin, e.end, what, cursor), e.name)
        cursor = e.end
    data_size = file_size - PREFIX - n
    if cursor != data_size:
        if cursor > data_size:
            raise bad("the tensors need %d data bytes but the file holds %d after the header: "
                      "the file is truncated" % (cursor, data_size))
        raise bad("%d bytes after the last tensor's data (the tensors cover %d of %d): the "
                  "file is corrupt" % (data_size - cursor, cursor, data_size))
    return Header(entries, metadata, n)


# --- saving -------------------------------------------------------------------


def _json_str(s):
    # serde_json's escaping equals Python's with ensure_ascii=False
    return json.dumps(s, ensure_ascii=False)


def layout(specs, metadata=None):
    """The header bytes (length prefix included, padded) and the file order
    of a save: specs is [(name, DType, header shape, nbytes)]; returns
    (header bytes, [(name, begin, end)] in data order). Same bytes as the
    safetensors library for the same tensors."""
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError("nvio.safetensors: metadata must be a dict of str to str, not %s"
                        % type(metadata).__name__)
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("nvio.safetensors: metadata must map str to str; %r: %r is not"
                                % (k, v))
    order = sorted(specs, key=lambda s: (-s[1].rank, s[0]))
    parts = []
    if metadata is not None:
        parts.append('"__metadata__":{%s}' % ",".join(
            "%s:%s" % (_json_str(k), _json_str(v)) for k, v in metadata.items()))
    placed = []
    off = 0
    for name, dt, shape, nbytes in order:
        parts.append('%s:{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}'
                     % (_json_str(name), dt.code, ",".join(str(int(s)) for s in shape),
                        off, off + nbytes))
        placed.append((name, off, off + nbytes))
        off += nbytes
    try:
        body = ("{" + ",".join(parts) + "}").encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError("nvio.safetensors: a name or metadata string is not valid Unicode "
                         "(%s)" % e) from None
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(8, "little") + body, placed


# --- paths, open errors and a model directory's files ----------------------


def _path(filename):
    if not isinstance(filename, (str, bytes, os.PathLike)):
        raise TypeError("nvio.safetensors: filename must be a path (str, bytes or "
                        "os.PathLike), not %s" % type(filename).__name__)
    return os.fsdecode(filename)


_OPEN_ERRORS = {}


def _open_error(e, path):
    """An OSError of e's own class (FileNotFoundError, PermissionError, and
    nvio's NvioError subclasses of them) whose message is what went wrong
    and the path, as safetensors words it ("No such file or directory:
    PATH"), with errno and filename set. libnvio's own message for a failed
    open describes it as an I/O op of 0 bytes at offset 0."""
    what = os.strerror(e.errno)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = stat.S_IFREG
    if not stat.S_ISREG(mode):
        what += " (%s, not a regular file)" % _kind(mode)
    return _open_error_of(type(e), e.errno, what, path)


def _open_error_of(cls, err, what, path):
    """cls's subclass (made once) that reads "WHAT: PATH", instantiated.
    It pickles as a call of this function (the subclass is made at run
    time, so pickle cannot name it): the error crosses process boundaries
    (multiprocessing, executors) whole."""
    sub = _OPEN_ERRORS.get(cls)
    if sub is None:
        sub = type(cls.__name__, (cls,), {
            "__str__": lambda self: "%s: %s" % (self.strerror, self.filename),
            "__reduce__": lambda self: (_open_error_of, (cls, self.errno, self.strerror,
                                                         self.filename)),
            "__module__": cls.__module__})
        _OPEN_ERRORS[cls] = sub
    return sub(err, what, path)


_kind = _regular.kind


INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
#: Largest index file read (the biggest published ones are a few MB).
MAX_INDEX = 64 << 20


def _err(path, msg):
    return SafetensorsError("nvio.safetensors: %s: %s" % (path, msg), path)


def _read_index(index_path):
    """The bytes of an index file: a regular file of at most MAX_INDEX
    bytes. Opened without blocking and checked before reading, so that a
    FIFO, a device or a directory in its place is an error, never a hang."""
    try:
        return _regular.read_small(index_path, MAX_INDEX, lambda msg: SafetensorsError(
            "nvio.safetensors: the index " + msg, index_path))
    except SafetensorsError:
        raise
    except OSError as e:
        raise _open_error(e, index_path) from None


def _index_shards(index_path, root):
    """[shard path] (sorted) and {tensor: shard path} from an index file."""
    raw = _read_index(index_path)
    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_dups)
    except _Dup as e:
        raise _err(index_path, "names %r twice" % (e.args[0],)) from None
    except (ValueError, RecursionError) as e:
        raise _err(index_path, "not a valid JSON index (%s)" % str(e)[:200]) from None
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise _err(index_path, "no weight_map object of tensor name -> shard file")
    where = {}
    for name, shard in wm.items():
        parts = shard.replace("\\", "/").split("/")
        if os.path.isabs(shard) or ".." in parts or not shard:
            raise _err(index_path, "tensor %r: shard %r is not a file inside the directory"
                       % (name, shard))
        where[name] = os.path.join(root, shard)
    return sorted(set(where.values())), where


def resolve(path_or_dir):
    """([shard paths] in load order, {tensor: shard} or None) for a file, or
    a directory with an index or a single model.safetensors."""
    p = _path(path_or_dir)
    if not os.path.isdir(p):
        if not os.path.exists(p):
            raise FileNotFoundError(2, "nvio.safetensors: no such file or directory", p)
        return [p], None
    idx = os.path.join(p, INDEX)
    if os.path.isfile(idx):
        return _index_shards(idx, p)
    if os.path.isfile(os.path.join(p, SINGLE)):
        return [os.path.join(p, SINGLE)], None
    idxs = sorted(n for n in os.listdir(p) if n.endswith(".safetensors.index.json"))
    if len(idxs) == 1:
        return _index_shards(os.path.join(p, idxs[0]), p)
    files = sorted(n for n in os.listdir(p) if n.endswith(".safetensors"))
    if len(files) == 1:
        return [os.path.join(p, files[0])], None
    raise _err(p, "no %s or %s here (and not exactly one other index or .safetensors file "
               "to use instead)" % (INDEX, SINGLE))
