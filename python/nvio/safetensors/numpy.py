"""``safetensors.numpy`` on nvio: NumPy arrays to and from safetensors files.

    from nvio.safetensors import numpy as nst_np
    nst_np.save_file({"a": np.zeros((2, 2))}, "a.safetensors")
    arrays = nst_np.load_file("a.safetensors")

The same arguments and the same file bytes as safetensors.numpy (header
laid out by the one format core, ``_format.layout``); saves are crash-safe
(a temporary renamed over the file, as nvio's torch saves) and written by
libnvio straight from the arrays' memory; loads read through libnvio into
arrays of their own. Big-endian arrays are stored little-endian, as the
format requires; a non-contiguous array is saved as its C-order copy.
"""
from __future__ import annotations

import sys

import numpy as np

from .._base.stformat import (DTYPES, PREFIX, SafetensorsError, _path, header_length, layout,
                              parse_header)
from ._io import write_planned
from ._lazy import NP_DTYPES, safe_open

#: NumPy dtype -> safetensors dtype code.
BY_NUMPY = {np.dtype(v): k for k, v in NP_DTYPES.items()}


def _little(a):
    """a, little-endian and C-contiguous (a copy only where needed)."""
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
        a = a.astype(a.dtype.newbyteorder("<"))
    return a if a.flags.c_contiguous else a.copy(order="C")


def plan(tensor_dict, metadata=None):
    """(header bytes, [(flat uint8 array, offset in the file)]) of a save,
    checked as safetensors.numpy checks it: a dict (ValueError), str keys
    (TypeError), NumPy arrays of a dtype safetensors has (ValueError)."""
    if not isinstance(tensor_dict, dict):
        raise ValueError("nvio.safetensors.numpy: expected a dict of [str, numpy.ndarray], "
                         "got %s" % type(tensor_dict))
    arrays, specs = {}, []
    for k, v in tensor_dict.items():
        if not isinstance(k, str):
            raise TypeError("nvio.safetensors.numpy: array names must be str; %r is %s"
                            % (k, type(k).__name__))
        if not isinstance(v, np.ndarray):
            raise ValueError("nvio.safetensors.numpy: key `%s`: expected numpy.ndarray, got %s"
                             % (k, type(v)))
        a = _little(v)
        code = BY_NUMPY.get(a.dtype)
        if code is None:
            raise ValueError("nvio.safetensors.numpy: array %r: dtype %s has no safetensors "
                             "dtype (known: %s)" % (k, v.dtype, ", ".join(
                                 str(d) for d in BY_NUMPY)))
        arrays[k] = a
        specs.append((k, DTYPES[code], list(a.shape), a.nbytes))
    head, placed = layout(specs, metadata)
    return head, [(arrays[name].reshape(-1).view(np.uint8), len(head) + begin)
                  for name, begin, end in placed if end > begin]


def save(tensor_dict, metadata=None):
    """``safetensors.numpy.save``: the bytes of a safetensors file."""
    head, data = plan(tensor_dict, metadata)
    out = bytearray(max([len(head)] + [off + b.nbytes for b, off in data]))
    out[:len(head)] = head
    for b, off in data:
        out[off:off + b.nbytes] = memoryview(b)
    return bytes(out)


def save_file(tensor_dict, filename, metadata=None, *, durable=True, spare=False, handle=None):
    """``safetensors.numpy.save_file``: the same bytes, written atomically
    by libnvio from the arrays' memory (``durable``, ``spare``, ``handle``
    as in nvio.safetensors.save_file)."""
    path = _path(filename)
    head, data = plan(tensor_dict, metadata)
    write_planned(path, head, data, durable=durable, spare=spare, handle=handle)


def load(data):
    """``safetensors.numpy.load``: arrays from the bytes of a whole file,
    owning their memory (one copy of the data region)."""
    mv = memoryview(data).cast("B")
    n = header_length(mv[:PREFIX], len(mv))
    header = parse_header(mv[PREFIX:PREFIX + n], len(mv))
    region = bytearray(mv[header.data_start:])
    out = {}
    for e in header.by_offset():
        dt = NP_DTYPES.get(e.dtype.code)
        if dt is None:
            raise SafetensorsError("nvio.safetensors.numpy: tensor %r: dtype %s has no NumPy "
                                   "dtype" % (e.name, e.dtype.code))
        a = np.frombuffer(region, dtype=dt, count=e.nbytes // np.dtype(dt).itemsize,
                          offset=e.begin) if e.nbytes else np.empty(0, dtype=dt)
        out[e.name] = a.reshape(e.shape)
    return out


def load_file(filename, *, backend="mmap", handle=None):
    """``safetensors.numpy.load_file``: {name: array} in file order, each
    read by libnvio into memory of its own (``backend``: "mmap" or
    "pread", as safetensors takes it; the same for nvio, see safe_open)."""
    with safe_open(filename, framework="np", backend=backend, handle=handle) as f:
        return f.get_tensors()
