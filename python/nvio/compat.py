"""DeepSpeed DeepNVMe names over nvio.

Code written for DeepNVMe runs with an import change::

    # from deepspeed.ops.op_builder import AsyncIOBuilder
    from nvio.compat import AsyncIOBuilder
    h = AsyncIOBuilder().load().aio_handle(block_size=1048576, queue_depth=32)

To make DeepSpeed itself use nvio's builder (ZeRO-Infinity's NVMe offload,
FastPersist writers, ds_io), without editing its code:
``nvio.integrations.deepspeed.use_nvio()``. The builders are complete op
builders for DeepSpeed's registry (``name``, ``NAME``, ``BUILD_VAR``,
``absolute_name``, ``is_compatible``, ``load``, ``jit_load``...).

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
    """A DeepSpeed op builder whose op is already built: the registry's
    attributes and methods (``name``, ``NAME``, ``BUILD_VAR``,
    ``absolute_name``, ``is_compatible``, ``load``, ``jit_load``,
    ``sources``...) with nvio's module behind ``load()``.

    ``absolute_name()`` names a module that ``importlib.import_module`` finds
    once ``load()`` ran, as DeepSpeed's loader expects of an installed op.
    ``sources()`` is empty and ``builder()`` refuses: there is nothing to
    compile, so nothing is ever JIT-built.
    """
    NAME = ""
    BUILD_VAR = ""

    def __init__(self, name=None):
        self.name = self.NAME if name is None else name
        self.jit_mode = False
        self.build_for_cpu = False
        self.enable_bf16 = False
        self.error_log = None

    def absolute_name(self):
        return f"nvio.compat.{self.NAME}"

    def is_compatible(self, verbose=False):
        return True

    def load(self, verbose=True):
        mod = self._module()
        sys.modules.setdefault(mod.__name__, mod)
        return mod

    def jit_load(self, verbose=True):
        return self.load(verbose)

    def builder(self):
        raise RuntimeError(f"nvio: {type(self).__name__} ({self.NAME}) is part of nvio's "
                           "extension and has nothing to build")

    def sources(self):
        return []

    def include_paths(self):
        return []

    def cxx_args(self):
        return []

    def nvcc_args(self):
        return []

    def extra_ldflags(self):
        return []

    def libraries_args(self):
        return []

    def strip_empty_entries(self, args):
        return [x for x in args if len(x) > 0]

    def warning(self, msg):
        self.error_log = f"{msg}"

    def _module(self):  # pragma: no cover - overridden
        raise NotImplementedError


def _op_module(name, **attrs):
    """The module object ``load()`` returns, named ``nvio.compat.<op>``."""
    mod = types.ModuleType(f"nvio.compat.{name}")
    mod.__dict__.update(attrs)
    return mod


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


_async_io = _op_module("async_io", aio_handle=AioHandle, aio_read=aio_read,
                       aio_write=aio_write, deepspeed_memcpy=deepspeed_memcpy)


class AsyncIOBuilder(_Builder):
    """``AsyncIOBuilder().load().aio_handle(...)`` -> :class:`nvio.AioHandle`."""
    NAME = "async_io"
    BUILD_VAR = "DS_BUILD_AIO"

    def _module(self):
        return _async_io


# --------------------------------------------------------------------- gds

_gds = _op_module("gds", gds_handle=GdsHandle)


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


_pin_memory = _op_module("pin_memory", pin_handle=pin_handle)


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


_utils = _op_module("utils", cast_to_byte_tensor=cast_to_byte_tensor)


class UtilsBuilder(_Builder):
    NAME = "utils"

    def _module(self):
        return _utils
