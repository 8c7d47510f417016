"""The Megatron indexed dataset's index (.idx), parsed and checked before any
sample is read (pure NumPy: no torch, no megatron).

Layout, as megatron.core.datasets.indexed_dataset._IndexWriter writes it
(little endian): the magic ``MMIDIDX\\0\\0``, version u64 = 1, dtype code u8,
sequence count S u64, document count D u64, then S int32 lengths (tokens),
S int64 byte pointers into the .bin, D int64 document indices (sequence
numbers ending each document, the first 0, the last S) and, in multimodal
datasets, S int8 modes.
"""
import os
import struct

import numpy as np

from .. import _regular
from ._errors import DataFormatError, DataTruncatedError

MAGIC = b"MMIDIDX\x00\x00"
HEADER_SIZE = 34
# Megatron's DType codes.
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
          6: np.float64, 7: np.float32, 8: np.uint16}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}


def open_regular(path):
    """(binary file object, size) of the regular file at path; a FIFO, a
    device or a directory is a DataFormatError naming it (opened without
    blocking: a FIFO's open or read would wait for a writer forever)."""
    f = _regular.open_regular(path, "rb", lambda msg: DataFormatError(
        "nvio.data: %s" % msg, path))
    return f, os.fstat(f.fileno()).st_size


def regular_size(path):
    """The size of the regular file at path (see open_regular)."""
    f, size = open_regular(path)
    f.close()
    return size


def idx_path(prefix):
    return prefix + ".idx"


def bin_path(prefix):
    return prefix + ".bin"


class Index:
    """A checked index: ``dtype``, ``sequence_lengths`` (int32),
    ``sequence_pointers`` (int64), ``document_indices`` (int64),
    ``sequence_modes`` (int8 or None), read-only views of the .idx file."""

    def __init__(self, path, dtype, lengths, pointers, documents, modes):
        self.path = path
        self.dtype = dtype
        self.sequence_lengths = lengths
        self.sequence_pointers = pointers
        self.document_indices = documents
        self.sequence_modes = modes

    def __len__(self):
        return len(self.sequence_lengths)


def read_index(path, multimodal=False, bin_size=None, bin_name=None):
    """Parse and check the .idx at path; with bin_size, also that every
    sequence lies inside a .bin of that many bytes. DataFormatError /
    DataTruncatedError name the file and what is wrong."""
    f, size = open_regular(path)
    with f:
        head = f.read(HEADER_SIZE)
    if len(head) < HEADER_SIZE:
        raise DataTruncatedError("%s: the index is truncated: %d bytes, its header needs %d"
                                 % (path, len(head), HEADER_SIZE), path, offset=0,
                                 nbytes=HEADER_SIZE)
    if head[:9] != MAGIC:
        raise DataFormatError("%s: no Megatron index (magic %r, expected %r)"
                              % (path, head[:9], MAGIC), path, offset=0, nbytes=9)
    version, code, s, d = struct.unpack_from("<QBQQ", head, 9)
    if version != 1:
        raise DataFormatError("%s: index version %d, nvio.data reads version 1" % (path, version),
                              path, offset=9, nbytes=8)
    if code not in DTYPES:
        raise DataFormatError("%s: unknown dtype code %d at offset 17 (known: %s)"
                              % (path, code, ", ".join("%d=%s" % (k, np.dtype(v).name)
                                                       for k, v in DTYPES.items())),
                              path, offset=17, nbytes=1)
    need = HEADER_SIZE + 12 * s + 8 * d + (s if multimodal else 0)
    if s > size or d > size or need > size:
        raise DataTruncatedError(
            "%s: the index is truncated: %d bytes, its %d sequences and %d documents%s need %d"
            % (path, size, s, d, " with modes" if multimodal else "", need), path,
            offset=0, nbytes=need)
    mm = np.memmap(path, mode="r", dtype=np.uint8)
    off = HEADER_SIZE
    lengths = mm[off:off + 4 * s].view(np.int32)
    off += 4 * s
    pointers = mm[off:off + 8 * s].view(np.int64)
    off += 8 * s
    documents = mm[off:off + 8 * d].view(np.int64)
    off += 8 * d
    modes = mm[off:off + s].view(np.int8) if multimodal else None
    dtype = np.dtype(DTYPES[code])
    _check(path, dtype, lengths, pointers, documents, bin_size, bin_name)
    return Index(path, dtype, lengths, pointers, documents, modes)


def _check(path, dtype, lengths, pointers, documents, bin_size, bin_name):
    bad = np.flatnonzero(lengths < 0)
    if bad.size:
        i = int(bad[0])
        raise DataFormatError("%s: sequence %d has a negative length (%d)" % (path, i, lengths[i]),
                              path, sample=i)
    bad = np.flatnonzero(pointers < 0)
    if bad.size:
        i = int(bad[0])
        raise DataFormatError("%s: sequence %d has a negative offset (%d)" % (path, i, pointers[i]),
                              path, sample=i, offset=int(pointers[i]))
    if len(documents) == 0 or documents[0] != 0 or documents[-1] != len(lengths) or \
            (len(documents) > 1 and np.any(np.diff(documents) < 0)):
        raise DataFormatError("%s: document indices must rise from 0 to the sequence count %d "
                              "(first %s, last %s)" % (path, len(lengths),
                                                       documents[0] if len(documents) else None,
                                                       documents[-1] if len(documents) else None),
                              path)
    if bin_size is None or len(lengths) == 0:
        return
    # compared as room left after the pointer: pointer + bytes can pass
    # INT64_MAX and wrap negative, which "end > size" would let through
    sizes = lengths.astype(np.int64) * dtype.itemsize
    room = bin_size - np.minimum(pointers, bin_size)
    bad = np.flatnonzero((pointers > bin_size) | (sizes > room))
    if bad.size:
        i = int(bad[0])
        end = int(pointers[i]) + int(sizes[i])
        raise DataTruncatedError(
            "%s: sequence %d (bytes %d..%d, %d tokens of %s) lies past the end of %s (%d bytes)%s"
            % (path, i, pointers[i], end, lengths[i], dtype.name, bin_name, bin_size,
               "; %d sequences do" % bad.size if bad.size > 1 else ""),
            bin_name, sample=i, offset=int(pointers[i]), nbytes=int(sizes[i]))
