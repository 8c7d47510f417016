"""safe_open: a file's header at once, its tensors one by one on demand.

``get_tensor`` reads exactly one tensor's bytes into memory of its own;
``get_slice(name)[...]`` reads only the bytes of the rows (runs) the
index selects, straight into the result, as one vectored op. Framework
"pt" gives torch tensors, "np" NumPy arrays (safetensors' two frameworks
without a third-party array library of their own).
"""
from __future__ import annotations

import operator

import torch

from .. import _device, _nvio
from .._base.handle import default_handle
from .._base.pieces import read_pieces as _read_pieces
from .._base.stformat import PACKED, SafetensorsError, _path
from .._base.views import tensor_u8 as _bytes_of
from ._io import check_backend, check_torch, open_file, read_header, read_owned, target_device

#: A slice cut into more runs than this is read whole and indexed in memory.
MAX_RUNS = 1 << 16


def _empty(shape, dtype, device):
    """An uninitialised contiguous tensor on device (CUDA memory through
    nvio._device, as every load of nvio's allocates it)."""
    if device.type != "cuda":
        return torch.empty(shape, dtype=dtype, device=device)
    n = torch._utils._element_size(dtype)
    for d in shape:
        n *= d
    s = _device.empty(n, device)
    return torch.empty(0, dtype=dtype, device=s.device).set_(s, 0, tuple(shape))


#: framework names safe_open takes: torch tensors or NumPy arrays.
FRAMEWORKS = {"pt": "pt", "torch": "pt", "pytorch": "pt", "np": "np", "numpy": "np"}


class safe_open:  # noqa: N801  (the safetensors library's name)
    """``safetensors.safe_open(filename, framework="pt", device="cpu",
    *, backend="mmap")``: a context manager over one file whose header is
    read and validated on open; ``keys()``, ``offset_keys()``,
    ``metadata()``, ``get_tensor(name)``, ``get_slice(name)``,
    ``get_tensors()``; every one of them raises SafetensorsError (a
    SafetensorError) once the file is closed.

    ``framework``: "pt" (torch tensors) or "np" (NumPy arrays, on the CPU).
    ``backend``: "mmap" or "pread", as safetensors takes them (anything
    else is refused the same way); for nvio both mean the same: each
    ``get_tensor`` and slice reads just its bytes through libnvio into
    memory of its own, and the file is never mapped. A file that cannot be
    opened raises the OSError of its errno (FileNotFoundError, ...) naming
    the path."""

    def __init__(self, filename, framework="pt", device="cpu", *, backend="mmap",
                 handle=None):
        fw = FRAMEWORKS.get(framework) if isinstance(framework, str) else None
        if fw is None:
            raise SafetensorsError("nvio.safetensors.safe_open: framework %r is not one of %s"
                                   % (framework, ", ".join(map(repr, FRAMEWORKS))))
        check_backend(backend)
        self.path = _path(filename)
        self.framework = fw
        h = handle if handle is not None else default_handle()
        self._f = open_file(h, self.path, _nvio.FILE_READ)
        try:
            self._header = read_header(self._f, self.path)
            if fw == "pt":
                check_torch(self._header, self.path)
                self._device = target_device(device, self.path)
            else:
                self._device = _np_device(device, self.path)
        except BaseException:
            self._f.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        self._f.close()

    def _open_header(self):
        if self._f.closed:
            raise SafetensorsError("nvio.safetensors: %s: the file is closed" % self.path,
                                   self.path)
        return self._header

    def _entry(self, name):
        if not isinstance(name, str):      # TypeError, as safetensors raises
            raise TypeError("nvio.safetensors: %s: a tensor name is a str, not %s (%r)"
                            % (self.path, type(name).__name__, name))
        e = self._open_header().entries.get(name)
        if e is None:
            raise SafetensorsError("nvio.safetensors: %s: no tensor named %r"
                                   % (self.path, name), self.path)
        return e

    def keys(self):
        """Tensor names, sorted (as safetensors gives them)."""
        return sorted(self._open_header().entries)

    def offset_keys(self):
        """Tensor names in file order."""
        return [e.name for e in self._open_header().by_offset()]

    def metadata(self):
        """The header's ``__metadata__`` dict, or None."""
        md = self._open_header().metadata
        return dict(md) if md is not None else None

    def get_tensor(self, name):
        """One tensor, read alone into memory of its own."""
        e = self._entry(name)
        if self.framework == "np":
            a = _np_empty(e, self.path)
            if e.nbytes:
                self._f.pread(_np_bytes(a), self._header.data_start + e.begin)
            return a
        return _whole(self, e)

    def get_tensors(self):
        """Every tensor (file order), each in memory of its own."""
        header = self._open_header()
        if self.framework == "np":
            out = {e.name: _np_empty(e, self.path) for e in header.by_offset()}
            _read_pieces(self._f, [(_np_bytes(out[e.name]), header.data_start + e.begin)
                                   for e in header.by_offset() if e.nbytes])
            return out
        return read_owned(self._f, header, self._device, None)

    def get_slice(self, name):
        """A lazy view of one tensor: ``get_shape()``, ``get_dtype()``, and
        indexing that reads only the bytes selected when the index is made
        of ints, slices with positive steps and Ellipsis. With framework
        "pt" any other index torch takes (None, lists, bools, tensors,
        negative steps) works too, on the whole tensor read into memory.
        With "np" the index is what safetensors takes for NumPy: ints,
        slices with positive steps and one Ellipsis (or a tuple of them), an
        empty list; anything else and out-of-range bounds are refused with
        SafetensorsError, as the safetensors library does."""
        return _Slice(self, self._entry(name))


def _np_device(device, path):
    if device not in ("cpu", None) and str(device) != "cpu":
        raise SafetensorsError("nvio.safetensors: %s: framework 'np' loads to the CPU only, "
                               "not %r" % (path, device), path)
    return torch.device("cpu")


def _np_dtype(e, path):
    import numpy as np
    name = NP_DTYPES.get(e.dtype.code)
    if name is None:
        raise SafetensorsError("nvio.safetensors: %s: tensor %r: dtype %s has no NumPy dtype "
                               "(load it with framework='pt')" % (path, e.name, e.dtype.code),
                               path)
    return np.dtype(name)


def _np_empty(e, path):
    import numpy as np
    return np.empty(tuple(e.shape), dtype=_np_dtype(e, path))


def _np_bytes(a):
    """A writable flat uint8 view of a contiguous NumPy array."""
    return a.reshape(-1).view("u1")


#: safetensors dtype -> NumPy dtype (the ones NumPy has; little-endian).
NP_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "U64": "<u8",
             "I32": "<i4", "U32": "<u4", "I16": "<i2", "U16": "<u2", "I8": "i1", "U8": "u1",
             "BOOL": "?", "C64": "<c8"}


def _norm(index, shape, name):
    """Per-dimension (start, stop, step, keep) for an index over shape."""
    if not isinstance(index, tuple):
        index = (index,)
    if sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexError("tensor %r: an index can only have one Ellipsis" % name)
    if Ellipsis in index:
        at = index.index(Ellipsis)
        fill = len(shape) - (len(index) - 1)
        index = index[:at] + (slice(None),) * max(fill, 0) + index[at + 1:]
    if len(index) > len(shape):
        raise IndexError("tensor %r: %d indices for %d dimensions" % (name, len(index), len(shape)))
    out = []
    for dim, (i, n) in enumerate(zip(index + (slice(None),) * (len(shape) - len(index)), shape)):
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step <= 0:
                raise IndexError("tensor %r: step %d in dimension %d: only positive steps"
                                 % (name, step, dim))
            stop = max(stop, start)
            out.append((start, stop, step, True))
        elif isinstance(i, int) and not isinstance(i, bool):
            j = i + n if i < 0 else i
            if not 0 <= j < n:
                raise IndexError("tensor %r: index %d out of range for dimension %d of size %d"
                                 % (name, i, dim, n))
            out.append((j, j + 1, 1, False))
        else:
            raise TypeError("tensor %r: unsupported index %r (ints, slices and ... only)"
                            % (name, i))
    return out


def _as_int(x):
    """x as a Python int when it is an integer index other than a bool or a
    tensor (those go to torch's own indexing), else None."""
    if isinstance(x, (bool, torch.Tensor)):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def _plain(index):
    """index as a tuple of ints, slices (int bounds, positive steps) and
    Ellipsis, which _norm and _runs read piece by piece; None when it holds
    anything else."""
    items = index if isinstance(index, tuple) else (index,)
    out = []
    for i in items:
        if i is Ellipsis:
            out.append(i)
        elif isinstance(i, slice):
            parts = [None if v is None else _as_int(v) for v in (i.start, i.stop, i.step)]
            if any(p is None and v is not None for p, v in zip(parts, (i.start, i.stop, i.step))):
                return None
            if parts[2] is not None and parts[2] <= 0:
                return None
            out.append(slice(*parts))
        else:
            n = _as_int(i)
            if n is None:
                return None
            out.append(n)
    return tuple(out)


def _np_index(index, shape, what=""):
    """The index safetensors takes for NumPy arrays as a tuple of ints and
    slices, with its errors (SafetensorsError, worded as safetensors words
    them, which callers of it may compare)."""
    if isinstance(index, list):
        if index:
            raise SafetensorsError("Non empty lists are not implemented")
        items = (slice(0, 0),)
    else:
        items = index if isinstance(index, tuple) else (index,)
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise SafetensorsError(what + "an index can only have one Ellipsis (...), not %r"
                               % (index,))
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = (items[:at] + (slice(None),) * max(len(shape) - (len(items) - 1), 0)
                 + items[at + 1:])
    sel, shown = [], []
    for d, i in enumerate(items):
        n = shape[d] if d < len(shape) else None
        if isinstance(i, slice):
            lo, hi, step = (None if v is None else _as_int(v)
                            for v in (i.start, i.stop, i.step))
            if ((lo is None) != (i.start is None) or (hi is None) != (i.stop is None)
                    or (step is None) != (i.step is None)):
                raise TypeError(what + "index %d of %r: slice bounds and steps must be "
                                "integers" % (d, index))
            if step is not None and step <= 0:
                raise SafetensorsError(what + "index %d of %r: a slice's step must be "
                                       "positive, not %d" % (d, index, step))
            if (lo or 0) < 0 or (hi or 0) < 0:
                raise SafetensorsError(what + "negative slice bounds are not supported for NumPy "
                                       "slices: %r in dimension %d" % (i, d))
            sel.append(slice(lo, hi, step))
            shown.append("%s:%s" % ("" if lo is None else lo, "" if hi is None else hi))
        else:
            j = _as_int(i)
            if j is None:
                raise SafetensorsError(what + "index %d of %r: a NumPy slice takes ints, "
                                       "slices and one Ellipsis, not %r" % (d, index, i))
            if j < 0 and n is not None:
                if j + n < 0:
                    raise SafetensorsError("Invalid index %d for dimension %d of size %d"
                                           % (j, d, n))
                j += n
            sel.append(j)
            shown.append(str(j))
    where = "Error during slicing [%s] with shape %s: " % (", ".join(shown), list(shape))
    if len(sel) > len(shape):
        raise SafetensorsError(where + "more slicing indexes than dimensions in tensor")
    for d in range(len(sel) - 1, -1, -1):      # the last bad dimension is named
        i, n = sel[d], shape[d]
        if isinstance(i, slice):
            lo = i.start or 0
            hi = n if i.stop is None else i.stop
            # an empty dimension sliced whole is no error here (it is in safetensors)
            bad = lo if lo >= n > 0 or lo > n else hi - 1 if hi > n else None
        else:
            bad = i if i >= n else None
        if bad is not None:
            raise SafetensorsError(where + "index %d out of bounds for tensor dimension #%d of "
                                   "size %d" % (bad, d, n))
    return tuple(sel)


class _Slice:
    def __init__(self, owner, entry):
        self._o = owner
        self._e = entry

    def get_shape(self):
        return list(self._e.shape)

    def get_dtype(self):
        return self._e.dtype.code

    def __len__(self):
        return self._e.shape[0] if self._e.shape else 0

    def __getitem__(self, index):
        e, o = self._e, self._o
        o._open_header()
        if o.framework == "np":
            _np_dtype(e, o.path)
            what = "nvio.safetensors: %s: tensor %r: " % (o.path, e.name)
            return self._read(_np_index(index, e.shape, what)).numpy()
        plain = _plain(index)
        if plain is None:                 # torch's full indexing, on the whole tensor
            return o.get_tensor(e.name)[index]
        return self._read(plain)

    def _read(self, index):
        """The selection of a plain index, reading only its bytes."""
        e, o = self._e, self._o
        shape = e.torch_shape()
        if e.dtype.code in PACKED and index not in ((Ellipsis,), (slice(None),)):
            # packed values share bytes: read whole, index in memory
            return o.get_tensor(e.name)[index]
        sel = _norm(index, shape, e.name)
        dims = [len(range(a, b, s)) for a, b, s, _ in sel]
        out = _empty(dims, e.dtype.torch, o._device)
        keep = [d for d, (_, _, _, k) in zip(dims, sel) if k]
        if out.numel() == 0:
            return out.reshape(keep)
        es = out.element_size()
        runs = _runs(sel, shape, es)
        if runs is None:
            return _whole(o, e)[index]
        dst = _bytes_of(out)
        base = o._header.data_start + e.begin
        pieces, pos = [], 0
        for off, n in runs:
            pieces.append((dst[pos:pos + n], base + off))
            pos += n
        _read_pieces(o._f, pieces)
        return out.reshape(keep)


def _whole(o, e):
    """The whole tensor as torch (also under framework "np")."""
    t = _empty(e.torch_shape(), e.dtype.torch, o._device)
    if e.nbytes:
        o._f.pread(_bytes_of(t), o._header.data_start + e.begin)
    return t


def _runs(sel, shape, es):
    """[(byte offset in the tensor, bytes)] that make up the selection in C
    order, adjacent runs merged; None when there would be over MAX_RUNS."""
    strides = [es] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    # the trailing dimensions selected whole form one contiguous block
    j = len(shape) - 1
    while j >= 0 and sel[j][:3] == (0, shape[j], 1):
        j -= 1
    if j < 0:
        return [(0, strides[0] * shape[0] if shape else es)]
    block = strides[j]
    a, b, s = sel[j][:3]
    if s == 1:
        inner = [(a * block, (b - a) * block)]
    else:
        inner = [(i * block, block) for i in range(a, b, s)]
    count = len(inner)
    for d in range(j):
        count *= len(range(*sel[d][:3]))
    if count > MAX_RUNS:
        return None
    offs = [0]
    for d in range(j):
        a, b, s = sel[d][:3]
        offs = [o + i * strides[d] for o in offs for i in range(a, b, s)]
    runs = []
    for o in offs:
        for off, n in inner:
            if runs and runs[-1][0] + runs[-1][1] == o + off:
                runs[-1] = (runs[-1][0], runs[-1][1] + n)
            else:
                runs.append((o + off, n))
    return runs
