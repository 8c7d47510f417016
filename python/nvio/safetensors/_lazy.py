"""safe_open: a file's header at once, its tensors one by one on demand.

``get_tensor`` reads exactly one tensor's bytes into memory of its own;
``get_slice(name)[...]`` reads only the bytes of the rows (runs) the
index selects, straight into the result, as one vectored op.
"""
from __future__ import annotations

import torch

from .. import _device, _nvio
from ..checkpoint._load import _read_pieces
from ..checkpoint._save import default_handle
from ._format import PACKED, SafetensorsError
from ._io import _path, check_torch, read_header, target_device

#: A slice cut into more runs than this is read whole and indexed in memory.
MAX_RUNS = 1 << 16


def _bytes_of(t):
    return t.reshape(-1).view(torch.uint8)


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


class safe_open:  # noqa: N801  (the safetensors library's name)
    """``safetensors.safe_open(filename, framework="pt", device="cpu")``:
    a context manager over one file whose header is read and validated on
    open; ``keys()``, ``offset_keys()``, ``metadata()``, ``get_tensor(name)``,
    ``get_slice(name)``, ``get_tensors()``."""

    def __init__(self, filename, framework="pt", device="cpu", *, handle=None):
        if framework not in ("pt", "torch", "pytorch"):
            raise ValueError("nvio.safetensors.safe_open: framework %r: only 'pt' (torch) "
                             "is supported" % (framework,))
        self.path = _path(filename)
        h = handle if handle is not None else default_handle()
        self._f = h.open(self.path, _nvio.FILE_READ)
        try:
            self._header = read_header(self._f, self.path)
            check_torch(self._header, self.path)
            self._device = target_device(device, self.path)
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

    def _entry(self, name):
        if self._f.closed:
            raise SafetensorsError("nvio.safetensors: %s: the file is closed" % self.path,
                                   self.path)
        e = self._header.entries.get(name)
        if e is None:
            raise SafetensorsError("nvio.safetensors: %s: no tensor named %r"
                                   % (self.path, name), self.path)
        return e

    def keys(self):
        """Tensor names, sorted (as safetensors gives them)."""
        return sorted(self._header.entries)

    def offset_keys(self):
        """Tensor names in file order."""
        return [e.name for e in self._header.by_offset()]

    def metadata(self):
        """The header's ``__metadata__`` dict, or None."""
        md = self._header.metadata
        return dict(md) if md is not None else None

    def get_tensor(self, name):
        """One tensor, read alone into memory of its own."""
        e = self._entry(name)
        t = _empty(e.torch_shape(), e.dtype.torch, self._device)
        if e.nbytes:
            self._f.pread(_bytes_of(t), self._header.data_start + e.begin)
        return t

    def get_tensors(self):
        """Every tensor (file order), each in memory of its own."""
        from ._io import read_owned
        return read_owned(self._f, self._header, self._device, None)

    def get_slice(self, name):
        """A lazy view of one tensor: ``get_shape()``, ``get_dtype()``, and
        indexing (ints, slices with positive steps, Ellipsis) that reads only
        the bytes selected."""
        return _Slice(self, self._entry(name))


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
        shape = e.torch_shape()
        if e.dtype.code in PACKED and index not in (Ellipsis, slice(None)):
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
            return o.get_tensor(e.name)[index]
        dst = _bytes_of(out)
        base = o._header.data_start + e.begin
        pieces, pos = [], 0
        for off, n in runs:
            pieces.append((dst[pos:pos + n], base + off))
            pos += n
        _read_pieces(o._f, pieces)
        return out.reshape(keep)


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
