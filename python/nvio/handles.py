"""nvio.AioHandle: the DeepNVMe ``aio_handle`` API over libnvio.

The I/O methods are implemented in C (``nvio._nvio.Handle``); this module
adds what is easier to say in Python: page-locked tensors, tuned handles.

Deliberate differences from DeepSpeed's ``aio_handle``:

* Failures raise :class:`nvio.NvioError` (an ``OSError`` with ``errno``,
  ``filename``, ``op`` and ``offset``) instead of returning -1 or aborting.
  For errnos that Python maps to an ``OSError`` subclass the exception
  derives from both, e.g. a missing file raises ``NvioFileNotFoundError``,
  which is caught by ``except FileNotFoundError`` and by
  ``except nvio.NvioError``.
* Any size, offset and buffer address works, with or without O_DIRECT;
  reads past the end of a file raise ``NvioError(errno.ENODATA)`` instead
  of returning stale data.
* ``wait()`` with nothing queued returns 0 instead of aborting.
* Synchronous ``pread``/``pwrite`` return 1 (this op), not the number of
  previously queued async ops that happened to complete.
* A buffer given to an async op is kept alive until ``wait()``.
"""
from __future__ import annotations

import operator
import sys

from . import _nvio

__all__ = ["AioHandle", "aio_handle"]

_TUNABLE = ("block_size", "queue_depth", "single_submit", "overlap_events",
            "intra_op_parallelism", "engine")


def _is_torch_tensor(obj):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _is_numpy_array(obj):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.ndarray)


class AioHandle(_nvio.Handle):
    """An nvio I/O handle with the methods of DeepNVMe's ``aio_handle``.

    ``block_size``, ``queue_depth``, ``single_submit``, ``overlap_events`` and
    ``intra_op_parallelism`` mean what they mean in DeepSpeed. nvio adds
    ``engine`` ('auto', 'io_uring', 'libaio', 'psync'), ``direct`` ('auto',
    True/'on', False/'off') and ``staging_bytes`` (bounce memory per worker).
    The environment variables NVIO_ENGINE and NVIO_DIRECT override them.
    """

    __slots__ = ("_locked", "__weakref__")

    def __new__(cls, block_size=1048576, queue_depth=128, single_submit=False,
                overlap_events=False, intra_op_parallelism=1, *, engine="auto",
                direct="auto", staging_bytes=16777216):
        self = super().__new__(cls, block_size, queue_depth, single_submit,
                               overlap_events, intra_op_parallelism,
                               engine=engine, direct=direct,
                               staging_bytes=staging_bytes)
        self._locked = {}
        return self

    @classmethod
    def tuned(cls, dir, for_write=False, **overrides):
        """A handle configured with what ``nvio tune`` saved for ``dir``.

        Keyword arguments override the saved values; without a saved entry
        the defaults (plus overrides) are used.
        """
        saved = _nvio.load_tuned(dir, for_write) or {}
        kwargs = {k: v for k, v in saved.items() if k in _TUNABLE}
        kwargs.update(overrides)
        return cls(**kwargs)

    def new_cpu_locked_tensor(self, num_elem, example_tensor):
        """A 1-D CPU tensor of ``num_elem`` elements of ``example_tensor``'s dtype.

        The memory is page-aligned, zeroed and page-locked when the memlock
        limit allows (also with CPU-only PyTorch builds). It is freed exactly
        once, when the last tensor using it is gone;
        ``free_cpu_locked_tensor`` drops the handle's reference. A NumPy
        example gives a NumPy array.
        """
        if self.closed:
            raise ValueError("nvio: I/O operation on a closed handle")
        n = operator.index(num_elem)
        if n < 0:
            raise ValueError(f"nvio: num_elem must be >= 0, not {n}")
        if _is_torch_tensor(example_tensor):
            import torch
            dtype = example_tensor.dtype
            esize = example_tensor.element_size()
            buf = _nvio.LockedBuffer(n * esize)
            if n == 0:
                return torch.empty(0, dtype=dtype)
            t = torch.frombuffer(buf, dtype=dtype, count=n)
            key = t.data_ptr()
        elif _is_numpy_array(example_tensor):
            import numpy as np
            dtype = example_tensor.dtype
            buf = _nvio.LockedBuffer(n * dtype.itemsize)
            t = np.frombuffer(buf, dtype=dtype, count=n)
            key = buf.address
        else:
            raise TypeError("nvio: example_tensor must be a torch.Tensor or a "
                            f"numpy.ndarray, not {type(example_tensor).__name__}")
        self._locked[key] = buf
        return t

    def free_cpu_locked_tensor(self, tensor):
        """Forget a tensor made by ``new_cpu_locked_tensor``.

        Returns True if it was one of this handle's, else False. The memory
        itself is released when no tensor refers to it any more, so a tensor
        still in use never points at freed memory.
        """
        try:
            addr, _ = _nvio.buffer_info(tensor)
        except (TypeError, ValueError):
            return False
        return self._locked.pop(addr, None) is not None

    def is_pinned(self, tensor):
        """True if the tensor's memory is page-locked (nvio or torch pinned)."""
        try:
            addr, n = _nvio.buffer_info(tensor)
        except (TypeError, ValueError):
            return False
        if _nvio.mem_query(addr, n) & _nvio.MEM_LOCKED:
            return True
        if _is_torch_tensor(tensor):
            try:
                return bool(tensor.is_pinned())
            except RuntimeError:
                return False
        return False

    def close(self):
        """Wait for ops in flight, free the handle and drop locked-tensor refs."""
        super().close()
        self._locked.clear()

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        if self.closed:
            return f"<nvio.AioHandle closed>"
        return (f"<nvio.AioHandle engine={self.get_engine()} direct={self.get_direct()} "
                f"block_size={self.get_block_size()} queue_depth={self.get_queue_depth()} "
                f"intra_op_parallelism={self.get_intra_op_parallelism()}>")


#: DeepSpeed's name for the class.
aio_handle = AioHandle
