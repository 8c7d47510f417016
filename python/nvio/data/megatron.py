"""Megatron-core's datasets reading through nvio (imports megatron.core).

The seam: megatron's IndexedDataset reads every sample through its
``bin_reader``, a ``_BinReader`` (``read(dtype, count, offset)``) that
``IndexedDataset.initialize`` picks: mmap, file or object store. Here

* :class:`NvioBinReader` is a ``_BinReader`` whose reads are nvio preads of
  this process's own handle (a DataLoader worker opens its own);
* :class:`NvioIndexedDataset` is megatron's IndexedDataset whose
  ``initialize`` (run on construction and again on unpickling in a spawned
  worker) checks the index against the .bin (nvio.data's checks: clear
  errors instead of garbage) and installs an NvioBinReader;
* :class:`NvioGPTDataset` is megatron's GPTDataset whose
  ``build_low_level_dataset`` (the hook BlendedMegatronDatasetBuilder calls
  per dataset prefix) returns an NvioIndexedDataset. Give it to the builder
  where GPTDataset was: ``BlendedMegatronDatasetBuilder(NvioGPTDataset,
  sizes, is_built_on_rank, config).build()``; blended datasets are made of
  it unchanged. Its ``__getitems__`` (DataLoader batches) reads a batch's
  token ranges in ONE vectored submission, then builds each sample with
  megatron's own ``__getitem__`` from them.

Nothing is patched: megatron's classes are subclassed, never modified.
nvio's options come from :data:`options` (engine, direct, queue_depth,
block_size, gds), read when a dataset is built.
"""
import contextlib
import threading

import numpy as np
from megatron.core.datasets import indexed_dataset as _mid
from megatron.core.datasets.gpt_dataset import GPTDataset

from . import _buffers
from ._datasets import IndexedDataset as _NvioIndexed
from ._errors import DataFormatError, SampleIndexError
from ._read import BLOCK_SIZE, QUEUE_DEPTH, PendingBatch, plan_reads

#: nvio's options for the datasets built here.
options = dict(engine="auto", direct="auto", queue_depth=QUEUE_DEPTH, block_size=BLOCK_SIZE,
               gds=False)

__all__ = ["NvioBinReader", "NvioIndexedDataset", "NvioGPTDataset", "options"]


class NvioBinReader(_mid._BinReader):
    """megatron's _BinReader over an nvio.data IndexedDataset's reader.

    A batch (NvioGPTDataset.__getitems__) serves its reads through a
    per-thread override (:meth:`batch`), never by swapping the dataset's
    ``bin_reader``: train/valid/test GPTDatasets share one low-level
    dataset, and a batch read in one thread must not be served by
    another's."""

    def __init__(self, reader):
        self.reader = reader
        self._local = threading.local()

    @contextlib.contextmanager
    def batch(self, serve):
        """Serve this thread's reads through serve (a _BinReader) meanwhile."""
        before = getattr(self._local, "serve", None)
        self._local.serve = serve
        try:
            yield serve
        finally:
            self._local.serve = before

    def read(self, dtype, count, offset):
        serve = getattr(self._local, "serve", None)
        if serve is not None:
            return serve.read(dtype, count, offset)
        return self.read_file(dtype, count, offset)

    def read_file(self, dtype, count, offset):
        """read() from the file itself (no batch's override)."""
        src = self.reader.source
        dt = np.dtype(dtype)
        count, offset = int(count), int(offset)
        if count < 0 or offset < 0 or offset + count * dt.itemsize > src.size:
            raise SampleIndexError("%s: %d items of %s at offset %d lie outside its %d bytes"
                                   % (src.path, count, dt.name, offset, src.size), src.path,
                                   offset=offset, nbytes=count * dt.itemsize)
        return self.reader._read_into(np.empty(count, dt), offset, "at byte %d" % offset)


class NvioIndexedDataset(_mid.IndexedDataset):
    """megatron's IndexedDataset, its .bin read through nvio (see above)."""

    def initialize(self, path_prefix, multimodal, mmap, object_storage_config,
                   fast_cache_load=False, sequences_per_dataset=None, dtype_code=None):
        if object_storage_config is not None:
            raise DataFormatError("%s: nvio.data reads local files, not object storage"
                                  % path_prefix, path_prefix)
        # nvio.data's reader checks the whole index against the .bin first.
        self.nvio = _NvioIndexed(path_prefix, multimodal, **options)
        super().initialize(path_prefix, multimodal, False, None, fast_cache_load,
                           sequences_per_dataset, dtype_code)
        self.mmap = mmap
        self.bin_reader = NvioBinReader(self.nvio)

    def __del__(self):
        # megatron's __del__ deletes bin_reader and index, and raises where
        # initialize refused the files before setting them.
        self.__dict__.pop("bin_reader", None)
        self.__dict__.pop("index", None)


class NvioGPTDataset(GPTDataset):
    """megatron's GPTDataset over NvioIndexedDataset (see above)."""

    @staticmethod
    def build_low_level_dataset(dataset_path, config):
        sequences_per_dataset = None
        if config.sequences_per_dataset:
            sequences_per_dataset = config.sequences_per_dataset[dataset_path]
        return NvioIndexedDataset(dataset_path, multimodal=False, mmap=False,
                                  fast_cache_load=config.fast_cache_load,
                                  sequences_per_dataset=sequences_per_dataset,
                                  dtype_code=config.token_dtype_code)

    def __getitems__(self, indices):
        """The samples at indices, their token ranges read in ONE vectored
        submission: megatron's own __getitem__ then builds each sample, its
        reads served from the batch's buffer (through this thread's
        override of the reader: see NvioBinReader.batch)."""
        reader = getattr(self.dataset, "bin_reader", None)
        if (not hasattr(self, "_query_document_sample_shuffle_indices")
                or not isinstance(reader, NvioBinReader)):
            return [self[i] for i in indices]       # another megatron: sample by sample
        ranges = _Recorder(reader)
        with reader.batch(ranges):
            for i in indices:
                if i is not None:
                    self._query_document_sample_shuffle_indices(int(i))
        with reader.batch(ranges.fetch()):
            return [self[i] for i in indices]


class _Recorder(_mid._BinReader):
    """First pass: notes the (dtype, count, offset) megatron asks for and
    answers zeros; fetch() reads them all at once and returns the reader of
    the second pass, which answers from the batch."""

    def __init__(self, inner):
        self.inner = inner
        self.wants = {}

    def read(self, dtype, count, offset):
        dt = np.dtype(dtype)
        self.wants[(int(offset), int(count) * dt.itemsize)] = None
        return np.zeros(int(count), dt)

    def fetch(self):
        keys = list(self.wants)
        reader = self.inner.reader
        src = reader.source
        for off, n in keys:
            if off < 0 or n < 0 or off + n > src.size:
                raise SampleIndexError("%s: bytes %d..%d lie outside its %d bytes"
                                       % (src.path, off, off + n, src.size), src.path,
                                       offset=off, nbytes=n)
        offs = np.array([k[0] for k in keys], np.int64)
        sizes = np.array([k[1] for k in keys], np.int64)
        plan = plan_reads(offs, sizes, src.align(), src.size)
        buf = _buffers.host(plan.total)
        mv = PendingBatch(src, ["at byte %d" % o for o in offs.tolist()], offs, sizes, plan, buf,
                          lambda b: memoryview(_buffers.as_tensor(b).numpy())).wait()
        return _Served(self.inner, {k: (int(p), mv) for k, p in zip(keys, plan.pos.tolist())})


class _Served(_mid._BinReader):
    def __init__(self, inner, got):
        self.inner = inner
        self.got = got

    def read(self, dtype, count, offset):
        dt = np.dtype(dtype)
        hit = self.got.get((int(offset), int(count) * dt.itemsize))
        if hit is None:
            return self.inner.read_file(dtype, count, offset)
        s, mv = hit
        return np.frombuffer(mv, dtype=dt, count=int(count), offset=s)

