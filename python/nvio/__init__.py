"""nvio: move bytes between memory and files at full device speed.

    import nvio
    h = nvio.AioHandle()                      # DeepNVMe's aio_handle, same methods
    h.sync_pwrite(tensor, "/nvme/t.bin")
    h.async_pread(tensor, "/nvme/t.bin"); h.wait()

Code written for DeepSpeed's DeepNVMe runs with an import change:
``from nvio.compat import AsyncIOBuilder``.

libnvio 0.2 in Python: ``h.open(path, flags)`` gives a :class:`File` (pread,
pwrite, preadv, pwritev, their ``*_async`` futures, streams);
``h.submit_async(ops)`` a batch of :class:`NvioFuture`; ``nvio.open(path,
"wb")`` a binary file object that ``torch.save``/``torch.load`` take as is.
"""
from . import _nvio
from ._nvio import (
    FILE_ATOMIC,
    FILE_CREATE,
    FILE_EXCL,
    FILE_NOSYNC,
    FILE_READ,
    FILE_SPARE,
    FILE_TRUNC,
    FILE_WRITE,
    FSYNC,
    OFFSET_PER_IOV,
    OP_READ,
    OP_WRITE,
    VALIDATE,
    Handle,
    LockedBuffer,
    Stream,
    NvioError,
    NvioBlockingIOError,
    NvioFileExistsError,
    NvioFileNotFoundError,
    NvioInterruptedError,
    NvioIsADirectoryError,
    NvioNotADirectoryError,
    NvioPermissionError,
    NvioTimeoutError,
    buffer_info,
    cufile_set_library,
    file_size,
    load_tuned,
    probe,
    staging_limit,
    staging_set_limit,
    strerror,
)
from ._futures import Completions, File, NvioFuture, completions
from .handles import AioHandle, GdsHandle, aio_handle, gds_handle, gds_mode
from .io import open  # noqa: A001  (nvio.open, like io.open)
from . import _renamed

__version__ = _nvio.version_string

ENGINES = ("io_uring", "libaio", "psync")


def engine_available(engine):
    """(True, "") if the engine can run here, else (False, why)."""
    return _nvio.engine_available(engine)


def available_engines():
    """The engines that can run in this process, best first."""
    return [e for e in ENGINES if _nvio.engine_available(e)[0]]


_CHECKPOINT = ("save", "load", "async_save", "AsyncCheckpointer", "CheckpointError")



def _lazy(name):
    """nvio.save, nvio.load, nvio.async_save...: imported on first use, so
    that ``import nvio`` does not import torch."""
    if name in _CHECKPOINT:
        from . import checkpoint
        return getattr(checkpoint, name)
    raise AttributeError("module 'nvio' has no attribute %r" % (name,))


# Names that changed in 0.3 (issue 31, one meaning per name): the old one
# still works, warning once. nvio.File is the open file of a handle, so
# nvio.open()'s file object is nvio.io.BufferedIO.
__getattr__ = _renamed.renamed(__name__, {"NvioFile": "nvio.io:BufferedIO"}, globals(), _lazy)


def version():
    """The libnvio version string, e.g. '0.1.0'."""
    return _nvio.version_string


__all__ = [
    "AioHandle", "aio_handle", "GdsHandle", "gds_handle", "gds_mode", "Handle", "LockedBuffer", "NvioError",
    "NvioFileNotFoundError", "NvioFileExistsError", "NvioPermissionError",
    "NvioIsADirectoryError", "NvioNotADirectoryError", "NvioInterruptedError",
    "NvioTimeoutError", "NvioBlockingIOError", "ENGINES", "engine_available",
    "available_engines", "buffer_info", "file_size", "load_tuned", "probe",
    "strerror", "version", "__version__", "cufile_set_library", "staging_limit",
    "staging_set_limit",
    "open", "save", "load", "async_save", "AsyncCheckpointer", "CheckpointError", "File", "Stream", "NvioFuture", "Completions", "completions",
    "FILE_READ", "FILE_WRITE", "FILE_CREATE", "FILE_EXCL", "FILE_TRUNC", "FILE_ATOMIC", "FILE_NOSYNC",
    "FILE_SPARE",
    "OP_READ", "OP_WRITE", "VALIDATE", "FSYNC", "OFFSET_PER_IOV",
]
