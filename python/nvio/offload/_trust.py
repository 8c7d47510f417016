"""What nvio.offload checks before it trusts a file it wrote itself (private).

The stores offload writes (a Swapper checkpoint's ``index.json`` and
``data.bin``, the weight store's ``nvio-weights.json`` and
``nvio-weights.bin``) are read back later, after anything may have
happened to them: a flipped byte, a hand edit, a FIFO or a device node
left at the name. So:

* a path is opened only if it is a regular file (:func:`open_regular`,
  :func:`check_regular`; nvio._regular, shared with nvio.safetensors): a
  FIFO would block open(2) or read(2) forever;
* an index is checked field by field against an allowlist before anything
  is read or allocated by it (:class:`Fields`), dtypes come from an
  explicit table (:data:`DTYPES`), never from ``getattr(torch, name)``;
* the data is covered by CRC-32s written beside it and checked when read.

Errors name the file and the field (``keys[3].shape[1]``).
"""
from __future__ import annotations

import os
import stat

import torch

from .. import _regular

__all__ = []

#: An index larger than this is refused before it is parsed.
INDEX_MAX = 256 << 20
#: Dimensions of a tensor at most (torch's own limit is 64).
NDIM_MAX = 64
#: A key nested in tuples this deep at most.
KEY_DEPTH_MAX = 32

_DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "complex128", "complex64",
                "complex32", "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16",
                "uint8", "bool", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
                # raw bit containers and quantized integers: a Swapper keeps
                # their bytes like any other's (and must restore what it wrote)
                "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2", "qint8", "quint8",
                "qint32", "quint4x2", "quint2x4")
#: The dtypes an index may name: {name as nvio writes it: torch.dtype}.
DTYPES = {n: getattr(torch, n) for n in _DTYPE_NAMES
          if isinstance(getattr(torch, n, None), torch.dtype)}


kind_of = _regular.kind
open_regular = _regular.open_regular


def check_regular(path, error):
    """Raise error(message) when path exists and is not a regular file
    (symbolic links followed). For paths libnvio opens: its open(2) of a
    FIFO would block."""
    try:
        st = os.stat(path)
    except OSError:
        return          # the open that follows says why
    if not stat.S_ISREG(st.st_mode):
        raise error("%s is %s, not a regular file" % (path, kind_of(st.st_mode)))


def read_index(path, error, limit=INDEX_MAX):
    """The bytes of an index file (regular, at most limit bytes)."""
    return _regular.read_small(path, limit, error)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


class Fields:
    """Checks of one index's fields; each failure raises
    error(message naming the file and the field)."""

    def __init__(self, path, error):
        self.path, self.error = path, error

    def fail(self, field, why):
        raise self.error("%s: field %s: %s" % (self.path, field, why), field)

    def dict(self, v, field, required, optional=()):
        if not isinstance(v, dict):
            self.fail(field, "must be an object, not %s" % type(v).__name__)
        for k in required:
            if k not in v:
                self.fail("%s.%s" % (field, k) if field else k, "is missing")
        extra = [k for k in v if k not in required and k not in optional]
        if extra:
            self.fail("%s.%s" % (field, extra[0]) if field else extra[0], "is not a known field")
        return v

    def list(self, v, field, length=None, limit=None):
        if not isinstance(v, list):
            self.fail(field, "must be a list, not %s" % type(v).__name__)
        if length is not None and len(v) != length:
            self.fail(field, "must have %d items, not %d" % (length, len(v)))
        if limit is not None and len(v) > limit:
            self.fail(field, "has %d items; at most %d" % (len(v), limit))
        return v

    def int(self, v, field, lo=0, hi=None, multiple=None):
        if not is_int(v):
            self.fail(field, "must be an integer, not %r" % (v,))
        if v < lo or (hi is not None and v > hi):
            self.fail(field, "%d is outside [%d, %s]" % (v, lo, "inf" if hi is None else hi))
        if multiple and v % multiple:
            self.fail(field, "%d is not a multiple of %d" % (v, multiple))
        return v

    def str(self, v, field, choices=None, hexlen=None):
        if not isinstance(v, str):
            self.fail(field, "must be a string, not %r" % (v,))
        if choices is not None and v not in choices:
            self.fail(field, "%r is not one of %s" % (v, ", ".join(sorted(choices))))
        if hexlen is not None and (len(v) != hexlen or
                                   any(c not in "0123456789abcdef" for c in v)):
            self.fail(field, "must be %d lowercase hex digits" % hexlen)
        return v

    def dtype(self, v, field):
        return DTYPES[self.str(v, field, choices=DTYPES)]

    def shape(self, v, field):
        self.list(v, field, limit=NDIM_MAX)
        for i, s in enumerate(v):
            self.int(s, "%s[%d]" % (field, i), 0, 1 << 62)
        return tuple(v)

    def crc(self, v, field):
        return self.int(v, field, 0, 0xFFFFFFFF)


def nbytes(dtype, shape):
    n = dtype.itemsize
    for s in shape:
        n *= s
    return n


def no_overlap(fields, ranges, field_of):
    """ranges: [(start, end, i)]; fails naming the later of two that overlap."""
    last_end, last = 0, None
    for start, end, i in sorted(ranges):
        if start == end:
            continue
        if last is not None and start < last_end:
            fields.fail(field_of(i), "bytes [%d, %d) overlap %s's, which end at %d"
                        % (start, end, field_of(last), last_end))
        if end > last_end:
            last_end, last = end, i
