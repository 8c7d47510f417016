"""The errors of nvio.data: one base, a subclass per case a caller tells apart."""


class DataError(Exception):
    """A dataset nvio.data cannot read. ``path``: the file; ``sample``: the
    sample index (None where no sample is concerned); ``offset`` and
    ``nbytes``: the byte range of the file concerned (None where none is)."""

    def __init__(self, msg, path=None, sample=None, offset=None, nbytes=None):
        super().__init__(msg)
        self.path = path
        self.sample = sample
        self.offset = offset
        self.nbytes = nbytes


class DataFormatError(DataError, ValueError):
    """The index (.idx) or header is no valid dataset: bad magic, version,
    dtype code, counts, lengths, pointers or document indices."""


class DataTruncatedError(DataFormatError):
    """A file is shorter than its index or header says (a truncated .bin or
    .idx, an index pointing past the data's end)."""


class SampleIndexError(DataError, IndexError):
    """A sample index outside the dataset (an IndexError too, so that
    iteration by __getitem__ stops as Python expects)."""


class SampleTypeError(DataError, TypeError, IndexError):
    """A sample index (or a token offset or length) that is no integer: a
    float such as 3.0, a bool, a string. A TypeError, as megatron's
    IndexedDataset.__getitem__ raises, and an IndexError, as NumPy's indexing
    (and so megatron's ``get``) raises; never read as the integer it
    equals."""


class DataReadError(DataError, OSError):
    """A read failed; ``errno`` and ``__cause__`` are the nvio.NvioError's."""

    def __init__(self, msg, path=None, sample=None, offset=None, nbytes=None, errno=None):
        DataError.__init__(self, msg, path, sample, offset, nbytes)
        self.errno = errno

    def __str__(self):
        return self.args[0]
