"""Datasets read by nvio: Megatron's indexed format and flat token files.

Both take indices from whatever chooses them (a PyTorch sampler, a
DistributedSampler, a BatchLoader) and read:

* one sample: ``ds[i]`` (one pread of this process's handle);
* a batch: ``ds.read_batch(indices)`` / ``ds.submit_batch(indices)``: ONE
  vectored submission of every sample's byte range into one buffer (see
  _read and _buffers); the samples are views of it. ``__getitems__`` is the
  same for torch's DataLoader, which calls it with a whole batch of indices
  when the dataset has it (pass ``collate_fn=nvio.data.collate`` to keep the
  views: the default collate copies them into a new tensor).
"""
import operator
import os

import numpy as np

from . import _buffers, _index
from ._errors import DataFormatError, DataTruncatedError, SampleIndexError, SampleTypeError
from ._read import (BLOCK_SIZE, QUEUE_DEPTH, PendingBatch, Source, choose_direct, plan_reads,
                    read_error)

_OPTS = ("engine", "direct", "queue_depth", "block_size", "gds")


class _Rows(list):
    """The rows of a batch tensor, with the batch (``.batch``)."""


def _unpack_samples(flat, starts, counts):
    return _Samples([flat[a:a + n] for a, n in zip(starts, counts)], (flat, starts, counts))


class _Samples(list):
    """An IndexedDataset batch: a list of views of one flat tensor. Sent
    from a DataLoader worker it pickles as that tensor (its shared memory,
    once) and the views' places, rebuilt as views on arrival: torch would
    pickle each view on its own (about 20 us of the main process's time a
    sample)."""

    def __init__(self, views, packed=None):
        super().__init__(views)
        self.packed = packed

    def __reduce__(self):
        if self.packed is None:
            return list, (list(self),)
        return _unpack_samples, self.packed


class _Reader:
    """What both datasets share: a Source, byte ranges per index, batches."""

    def _open(self, path, sizes, engine, direct, queue_depth, block_size, gds):
        self.direct, self.direct_why = choose_direct(direct, sizes)
        self.options = dict(engine=engine, direct=direct, queue_depth=queue_depth,
                            block_size=block_size, gds=gds)
        self.source = Source(path, engine=engine, direct=self.direct, queue_depth=queue_depth,
                             block_size=block_size, gds=gds)

    def _fail_index(self, idx):
        if not isinstance(idx, (bool, np.bool_)):
            try:
                idx = operator.index(idx)       # np.int64(90) said as 90
            except TypeError:
                pass
        raise SampleIndexError("%s: sample %r out of range: the dataset has %d samples"
                               % (self.source.path, idx, len(self)), self.source.path, sample=idx)

    def _integer(self, v, what):
        """v as an int where it is one (int, NumPy or torch integer), else
        SampleTypeError: 3.0 is refused, not read as sample 3, and so is a
        bool (NumPy takes it for a mask, megatron reads garbage)."""
        if not isinstance(v, (bool, np.bool_)):
            try:
                return operator.index(v)
            except TypeError:
                pass
        raise SampleTypeError("%s: %s %r (%s) is no integer" % (self.source.path, what, v,
                                                                 type(v).__name__),
                              self.source.path)

    def _position(self, idx):
        n = len(self)
        i = self._integer(idx, "sample index")
        if not -n <= i < n:
            self._fail_index(idx)
        return i + n if i < 0 else i

    def _positions(self, indices):
        """_position of every index of a batch: a list or array of plain
        integers at once (NumPy), anything else one by one."""
        if isinstance(indices, np.ndarray) and indices.ndim == 1 and (
                indices.dtype.kind == "i" or (indices.dtype.kind == "u" and
                                              indices.dtype.itemsize < 8)):
            arr = indices.astype(np.int64, copy=False)
        elif isinstance(indices, list) and all(type(i) is int for i in indices):
            try:
                arr = np.asarray(indices, dtype=np.int64)
            except OverflowError:
                return [self._position(i) for i in indices]
        else:
            return [self._position(i) for i in indices]
        n = len(self)
        bad = np.flatnonzero((arr < -n) | (arr >= n))
        if bad.size:
            self._fail_index(indices[int(bad[0])])
        return np.where(arr < 0, arr + n, arr).tolist()

    def _read_into(self, arr, offset, sample):
        """Fill a NumPy array from offset (one pread), errors named."""
        if arr.nbytes:
            try:
                self.source.file().pread(arr, int(offset))
            except OSError as e:
                raise read_error(self.source, [sample], [int(offset)], [arr.nbytes], e, [0]) from e
        return arr

    def submit_batch(self, indices, *, device=None, buffer=None):
        """Start reading the samples at indices (any iterable of ints) as ONE
        vectored submission into one buffer; a PendingBatch whose wait()
        gives the batch. device: None (host) or a CUDA device. buffer: a
        function nbytes -> buffer to land in (host only), else a new one."""
        samples = self._positions(indices)
        offsets, nbytes = self._ranges(samples)
        on_device = device is not None and str(device) != "cpu"
        # host batches with O_DIRECT: each sample's aligned covering range,
        # one request each (see plan_reads); device memory takes the exact
        # ranges (libnvio's bounce buffers or cuFile align them)
        plan = plan_reads(offsets, nbytes, 1 if on_device else self.source.align(),
                          self.source.size)
        total = self._room(plan, nbytes)
        if on_device:
            buf = _buffers.device(total, device)
        else:
            buf = buffer(total) if buffer is not None else _buffers.host(total)
        return PendingBatch(self.source, samples, offsets, nbytes, plan, buf,
                            lambda b: self._views(_buffers.as_tensor(b), samples, nbytes, plan))

    def _room(self, plan, nbytes):
        """Bytes of buffer a batch of plan needs."""
        return plan.total

    def read_batch(self, indices, *, device=None):
        """The samples at indices, read as one vectored submission (see
        submit_batch)."""
        return self.submit_batch(indices, device=device).wait()

    def __getitems__(self, indices):
        """torch's DataLoader's batched fetch: a list of the samples (what
        a collate_fn takes), views of the batch's one buffer; ``collate``
        gives back the batch itself, the default collate copies."""
        b = self.read_batch(indices)
        if isinstance(b, list):
            return b
        rows = _Rows(b.unbind(0))
        rows.batch = b
        return rows

    def close(self):
        """Close this process's handle (reopened on the next read)."""
        self.source.close()


class IndexedDataset(_Reader):
    """A Megatron indexed dataset (``prefix.idx`` + ``prefix.bin``, as
    megatron.core's IndexedDatasetBuilder writes it) read through nvio, with
    megatron's IndexedDataset access methods returning the same arrays:
    ``ds[i]`` (with ``multimodal``: (array, mode)), ``ds[a:b]``,
    ``get(idx, offset, length)``, ``sequence_lengths``,
    ``document_indices``, ``sequence_modes``; plus batches
    (``read_batch``: a list of torch tensors, views of one buffer).

    The index is checked whole before any read: magic, version, dtype code,
    counts, and that every sequence lies inside the .bin (a truncated .bin
    or an index pointing past it raises DataTruncatedError naming the
    sequence and its bytes). ``mmap`` is accepted for megatron's signature
    and ignored. nvio's options (keyword-only): ``engine``, ``direct``
    (True, False or "auto": see choose_direct; ``direct_why`` says what
    was chosen and why), ``queue_depth``, ``block_size``, ``gds``.
    """

    def __init__(self, path_prefix, multimodal=False, mmap=True, *, engine="auto",
                 direct="auto", queue_depth=QUEUE_DEPTH, block_size=BLOCK_SIZE, gds=False):
        self.path_prefix = os.fspath(path_prefix)
        self.multimodal = bool(multimodal)
        self.mmap = mmap
        bin_path = _index.bin_path(self.path_prefix)
        size = _index.regular_size(bin_path)
        self.index = _index.read_index(_index.idx_path(self.path_prefix), self.multimodal,
                                       size, bin_path)
        self._open(bin_path, [(bin_path, size)], engine, direct, queue_depth, block_size, gds)

    def __getstate__(self):
        s = dict(self.__dict__)
        del s["index"]          # memory maps: each process maps the .idx again
        return s

    def __setstate__(self, s):
        self.__dict__.update(s)
        self.index = _index.read_index(_index.idx_path(self.path_prefix), self.multimodal,
                                       self.source.size, self.source.path)

    def __len__(self):
        return len(self.index)

    @property
    def dtype(self):
        return self.index.dtype

    def _range(self, i, offset=0, length=None):
        n = int(self.index.sequence_lengths[i])
        if length is None:
            length = n - offset
        if offset < 0 or length < 0 or offset + length > n:
            raise SampleIndexError("%s: tokens %d..%d of sequence %d, which has %d"
                                   % (self.source.path, offset, offset + length, i, n),
                                   self.source.path, sample=i)
        isz = self.index.dtype.itemsize
        return int(self.index.sequence_pointers[i]) + offset * isz, int(length)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("Slices into indexed_dataset must be contiguous")
            lengths = self.index.sequence_lengths[idx]
            total = int(np.sum(lengths, dtype=np.int64))
            off = int(self.index.sequence_pointers[start]) if stop > start else 0
            flat = self._read_into(np.empty(total, self.index.dtype), off, "%d..%d" % (start, stop))
            seqs = np.split(flat, np.cumsum(lengths)[:-1])     # [] -> [flat], as megatron
            return (seqs, self.index.sequence_modes[idx]) if self.multimodal else seqs
        return self.get(idx)

    def get(self, idx, offset=0, length=None):
        """Tokens [offset, offset + length) of sequence idx (to its end by
        default); with multimodal, (array, mode)."""
        i = self._position(idx)
        off, n = self._range(i, self._integer(offset, "token offset"),
                             None if length is None else self._integer(length, "token length"))
        arr = self._read_into(np.empty(n, self.index.dtype), off, i)
        return (arr, self.index.sequence_modes[i]) if self.multimodal else arr

    def _ranges(self, samples):
        """(file offsets, byte counts) of samples."""
        s = np.asarray(samples, dtype=np.int64)
        offsets = self.index.sequence_pointers[s].astype(np.int64)
        return offsets, self.index.sequence_lengths[s].astype(np.int64) * self.index.dtype.itemsize

    @staticmethod
    def _repeats(plan, nbytes):
        """Mask of the samples that share their place in the buffer with an
        earlier one (an index twice in an aligned batch: read once)."""
        rep = np.zeros(len(nbytes), bool)
        if not plan.compact and len(nbytes) > 1:
            order = np.argsort(plan.pos, kind="stable")
            sp = plan.pos[order]
            rep[order[1:]] = (sp[1:] == sp[:-1]) & (nbytes[order[1:]] > 0)
        return rep

    def _room(self, plan, nbytes):
        """The reads, then room for a copy of each repeated sample."""
        rep = self._repeats(plan, nbytes)
        return (plan.total + 63) // 64 * 64 + int(nbytes[rep].sum()) if rep.any() else plan.total

    def _views(self, t, samples, nbytes, plan):
        """Each sample a view of the buffer t at its place in plan; a repeated
        sample is copied after the reads first, so no two samples alias."""
        tdt = _buffers.torch_dtype(self.index.dtype)
        isz = self.index.dtype.itemsize
        pos = plan.pos
        rep = self._repeats(plan, nbytes)
        if rep.any():
            pos = pos.copy()
            at = (plan.total + 63) // 64 * 64
            for i in np.flatnonzero(rep).tolist():
                n = int(nbytes[i])
                t[at:at + n].copy_(t[int(pos[i]):int(pos[i]) + n])
                pos[i] = at
                at += n
        flat = t[:t.numel() // isz * isz].view(tdt)
        if (pos % isz).any():           # a pointer off the dtype's grid: no view there
            return _Samples([t[p:p + n].clone().view(tdt) if p % isz else
                             flat[p // isz:(p + n) // isz]
                             for p, n in zip(pos.tolist(), nbytes.tolist())])
        return _unpack_samples(flat, (pos // isz).tolist(), (nbytes // isz).tolist())

    @property
    def sequence_lengths(self):
        return self.index.sequence_lengths

    @property
    def document_indices(self):
        return self.index.document_indices

    def get_document_indices(self):
        return self.index.document_indices

    def set_document_indices(self, document_indices):
        self.index.document_indices = document_indices

    @property
    def sequence_modes(self):
        if self.index.sequence_modes is None:
            raise DataFormatError("%s: not opened as multimodal: no sequence modes"
                                  % self.index.path, self.index.path)
        return self.index.sequence_modes

    @staticmethod
    def exists(path_prefix):
        return (os.path.exists(_index.idx_path(path_prefix)) and
                os.path.exists(_index.bin_path(path_prefix)))


# llm.c's token files: a header of 256 int32 (magic, version, token count),
# then the tokens: (magic, version) -> token dtype.
LLMC_HEADER = 256 * 4
LLMC = {(20240520, 1): np.uint16, (20240801, 7): np.uint32}


def token_layout(path, dtype=None, header="auto"):
    """(header bytes, token dtype, token count) of a flat token file: raw
    (nanoGPT's np.uint16 .bin; header=0) or llm.c's (header="llm.c", found
    by its magic with "auto"). DataFormatError / DataTruncatedError name
    what does not fit."""
    f, size = _index.open_regular(path)
    with f:
        head = f.read(LLMC_HEADER) if header in ("auto", "llm.c") else b""
    words = np.frombuffer(head[:12], "<i4") if len(head) >= 12 else None
    known = words is not None and (int(words[0]), int(words[1])) in LLMC
    if header == "llm.c" or (header == "auto" and known):
        if not known:
            raise DataFormatError("%s: no llm.c token file (magic/version %s)"
                                  % (path, None if words is None else words[:2].tolist()), path,
                                  offset=0, nbytes=8)
        tdt = np.dtype(LLMC[(int(words[0]), int(words[1]))])
        if dtype is not None and np.dtype(dtype) != tdt:
            raise DataFormatError("%s: llm.c version %d holds %s tokens, not %s"
                                  % (path, words[1], tdt.name, np.dtype(dtype).name), path)
        count = int(words[2])
        need = LLMC_HEADER + count * tdt.itemsize
        if count < 0 or size < need:
            raise DataTruncatedError("%s: truncated: %d bytes, its header says %d tokens of %s "
                                     "(%d bytes)" % (path, size, count, tdt.name, need), path,
                                     offset=LLMC_HEADER, nbytes=need - LLMC_HEADER)
        return LLMC_HEADER, tdt, count
    if header not in ("auto", 0, None):
        raise ValueError("nvio.data: header must be 'auto', 'llm.c' or 0, not %r" % (header,))
    tdt = np.dtype(np.uint16 if dtype is None else dtype)
    if tdt not in (np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.int32)):
        raise DataFormatError("%s: token dtype %s (uint16, uint32 or int32)" % (path, tdt.name),
                              path)
    if size % tdt.itemsize:
        raise DataTruncatedError("%s: %d bytes is no whole number of %s tokens"
                                 % (path, size, tdt.name), path, offset=size - size % tdt.itemsize)
    return 0, tdt, size // tdt.itemsize


class TokenWindows(_Reader):
    """Windows of ``seq_len + 1`` tokens of a flat token file, one per start
    position: ``ds[i]`` is tokens [i, i + seq_len + 1) (inputs ``w[:-1]``,
    targets ``w[1:]``), so a RandomSampler over it draws nanoGPT's random
    windows; ``stride`` > 1 keeps starts that are multiples of it.
    ``read_batch(indices)`` gives one tensor [len(indices), seq_len + 1] of
    the file's token dtype (``.long()`` for an embedding), a view of one
    buffer filled by ONE vectored submission.
    """

    def __init__(self, path, seq_len, *, dtype=None, header="auto", stride=1, engine="auto",
                 direct="auto", queue_depth=QUEUE_DEPTH, block_size=BLOCK_SIZE, gds=False):
        path = os.fspath(path)
        self.seq_len = int(seq_len)
        self.stride = int(stride)
        if self.seq_len < 1 or self.stride < 1:
            raise ValueError("nvio.data: seq_len and stride must be >= 1")
        self.header, self.dtype, self.ntokens = token_layout(path, dtype, header)
        if self.ntokens < self.seq_len + 1:
            raise DataFormatError("%s: %d tokens, fewer than one window of %d"
                                  % (path, self.ntokens, self.seq_len + 1), path)
        self._len = (self.ntokens - self.seq_len - 1) // self.stride + 1
        self._open(path, [(path, _index.regular_size(path))], engine, direct, queue_depth,
                   block_size, gds)

    def __len__(self):
        return self._len

    def _offset(self, i):
        return self.header + i * self.stride * self.dtype.itemsize

    def __getitem__(self, idx):
        import torch
        i = self._position(idx)
        arr = np.empty(self.seq_len + 1, self.dtype)
        self._read_into(arr, self._offset(i), i)
        return torch.from_numpy(arr)

    def _ranges(self, samples):
        s = np.asarray(samples, dtype=np.int64)
        w = (self.seq_len + 1) * self.dtype.itemsize
        return self.header + s * (self.stride * self.dtype.itemsize), np.full(len(s), w, np.int64)

    def _out_at(self, plan):
        """Where the batch tensor starts in the buffer: at 0 where plan
        packs the windows one after the other; else after the reads, where
        _views copies each window from its aligned read."""
        return 0 if plan.compact else (plan.total + 63) // 64 * 64

    def _room(self, plan, nbytes):
        return self._out_at(plan) + int(nbytes.sum())

    def _views(self, t, samples, nbytes, plan):
        """The batch: one tensor [len(samples), seq_len + 1] in t."""
        w = (self.seq_len + 1) * self.dtype.itemsize
        at = self._out_at(plan)
        if not plan.compact:
            # a window's aligned read has a different head each: rows at
            # equal strides need one copy (about 1 us per window, host
            # memory only: device batches are read compact)
            a = t.numpy()
            out = a[at:at + len(samples) * w].reshape(len(samples), w)
            for i, p in enumerate(plan.pos.tolist()):
                out[i] = a[p:p + w]
        return t[at:at + len(samples) * w].view(_buffers.torch_dtype(self.dtype)).view(
            len(samples), self.seq_len + 1)
