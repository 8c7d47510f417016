"""DeepSpeed DeepNVMe names over nvio.

Code written for DeepNVMe runs with an import change::

    # from deepspeed.ops.op_builder import AsyncIOBuilder
    from nvio.compat import AsyncIOBuilder
    h = AsyncIOBuilder().load().aio_handle(block_size=1048576, queue_depth=32)

Provided: ``AsyncIOBuilder`` (op ``async_io``: ``aio_handle``, ``aio_read``,
``aio_write``, ``deepspeed_memcpy``), ``GDSBuilder`` (``gds_handle``),
``PinMemoryBuilder`` (``pin_handle``) and
``UtilsBuilder`` (``cast_to_byte_tensor``). Failures raise
:class:`nvio.NvioError` instead of returning -1.

And ``deepspeed.io``'s FastPersist writers, for ``torch.save(obj, writer)``:
``FastFileWriter`` with ``FastFileWriterConfig``, ``MockFileWriter``,
``PyFileWriter`` (atomic: the file appears at ``close()``; see
:mod:`nvio._filewriters`)::

    # from deepspeed.io import FastFileWriter, FastFileWriterConfig
    from nvio.compat import FastFileWriter, FastFileWriterConfig
"""
from __future__ import annotations

import sys
import types

from . import _nvio
from ._filewriters import FastFileWriter, FastFileWriterConfig, MockFileWriter, PyFileWriter
from .handles import AioHandle, GdsHandle

__all__ = ["AsyncIOBuilder", "GDSBuilder", "PinMemoryBuilder", "UtilsBuilder",
           "cast_to_byte_tensor", "FastFileWriter", "FastFileWriterConfig",
           "MockFileWriter", "PyFileWriter"]


class _Builder:
    NAME = ""
    BUILD_VAR = ""

    def is_compatible(self, verbose=False):
        return True

    def absolute_name(self):
        return f"nvio.compat.{self.NAME}"

    def load(self, verbose=True):
        return self._module()

    def _module(self):  # pragma: no cover - overridden
        raise NotImplementedError


# ---------------------------------------------------------------- async_io

def aio_read(buffer, filename, block_size=1048576, queue_depth=128,
             single_submit=False, overlap_events=False, validate=False):
    """Read the whole file into buffer with a temporary handle; returns 0."""
    with AioHandle(block_size, queue_depth, single_submit, overlap_events) as h:
        return h.read(buffer, filename, validate)


def aio_write(buffer, filename, block_size=1048576, queue_depth=128,
              single_submit=False, overlap_events=False, validate=False):
    """Write the whole buffer to filename with a temporary handle; returns 0."""
    with AioHandle(block_size, queue_depth, single_submit, overlap_events) as h:
        return h.write(buffer, filename, validate)


def deepspeed_memcpy(dest, src):
    """dest.copy_(src) for tensors; returns 0 like DeepSpeed's."""
    dest.copy_(src)
    return 0


_async_io = types.SimpleNamespace(
    aio_handle=AioHandle, aio_read=aio_read, aio_write=aio_write,
    deepspeed_memcpy=deepspeed_memcpy, __name__="nvio.compat.async_io")


class AsyncIOBuilder(_Builder):
    """``AsyncIOBuilder().load().aio_handle(...)`` -> :class:`nvio.AioHandle`."""
    NAME = "async_io"
    BUILD_VAR = "DS_BUILD_AIO"

    def _module(self):
        return _async_io


# --------------------------------------------------------------------- gds

_gds = types.SimpleNamespace(gds_handle=GdsHandle, __name__="nvio.compat.gds")


class GDSBuilder(_Builder):
    """GPUDirect Storage: ``gds_handle`` is :class:`nvio.GdsHandle`, which uses
    cuFile where usable and locked bounce buffers otherwise."""
    NAME = "gds"
    BUILD_VAR = "DS_BUILD_GDS"

    def is_compatible(self, verbose=False):
        """True where torch sees a CUDA device (GDS itself may still run in
        compatibility mode or through bounce buffers: see nvio.gds_mode())."""
        torch = sys.modules.get("torch")
        return bool(torch is not None and torch.cuda.is_available())

    def _module(self):
        return _gds


# -------------------------------------------------------------- pin_memory

class pin_handle:
    """DeepSpeed's ``pin_handle``: page-locked CPU tensors from nvio memory."""

    def __init__(self):
        self._locked = {}

    def new_cpu_locked_tensor(self, num_elem, example_tensor, *, allow_unlocked=False):
        return AioHandle.new_cpu_locked_tensor(self, num_elem, example_tensor,
                                               allow_unlocked=allow_unlocked)

    def free_cpu_locked_tensor(self, tensor):
        return AioHandle.free_cpu_locked_tensor(self, tensor)

    def free_cpu_locked_tensor_by_ptr(self, address):
        return self._locked.pop(int(address), None) is not None

    def is_pinned(self, tensor):
        return AioHandle.is_pinned(self, tensor)

    closed = False


_pin_memory = types.SimpleNamespace(pin_handle=pin_handle,
                                    __name__="nvio.compat.pin_memory")


class PinMemoryBuilder(_Builder):
    NAME = "pin_memory"

    def _module(self):
        return _pin_memory


# ------------------------------------------------------------------- utils

def _byte_view(t):
    np = sys.modules.get("numpy")
    if np is not None and isinstance(t, np.ndarray):
        if not t.flags.c_contiguous:
            raise ValueError("nvio: cast_to_byte_tensor needs a contiguous array")
        return t.reshape(-1).view(np.uint8)
    if not t.is_contiguous():
        raise ValueError("nvio: cast_to_byte_tensor needs a contiguous tensor; "
                         "call .contiguous() first")
    import torch
    flat = t.reshape(-1)            # a view for contiguous tensors
    if flat.dtype == torch.uint8:
        return flat
    if flat.is_conj():
        flat = flat.resolve_conj()
    return flat.view(torch.uint8)  # a view: keeps the source alive


def cast_to_byte_tensor(src):
    """A 1-D uint8 view of a contiguous tensor (or of each tensor in a list).

    Zero-copy; unlike DeepSpeed's, the view keeps its source alive.
    """
    if isinstance(src, (list, tuple)):
        return [_byte_view(t) for t in src]
    return _byte_view(src)


_utils = types.SimpleNamespace(cast_to_byte_tensor=cast_to_byte_tensor,
                               __name__="nvio.compat.utils")


class UtilsBuilder(_Builder):
    NAME = "utils"

    def _module(self):
        return _utils
