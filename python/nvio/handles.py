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

import errno
import operator
import sys

from . import _nvio
from ._futures import File, completions

__all__ = ["AioHandle", "aio_handle", "GdsHandle", "gds_handle", "gds_mode"]

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
    True/'on', False/'off') and ``staging_bytes`` (bounce memory per worker;
    0 = block_size * queue_depth, twice that with overlap_events off, at
    most 128 MiB).
    The environment variables NVIO_ENGINE and NVIO_DIRECT supply what is left
    at 'auto'; an explicit setting wins.
    """

    __slots__ = ("_locked", "_completions", "__weakref__")

    _GDS = False
    #: What ``open()`` / ``open_fd()`` make: files with ``*_async`` methods.
    _file_class = File

    def __new__(cls, block_size=1048576, queue_depth=128, single_submit=False,
                overlap_events=False, intra_op_parallelism=1, *, engine="auto",
                direct="auto", staging_bytes=0):
        if cls._GDS:
            _find_cufile()
        self = super().__new__(cls, block_size, queue_depth, single_submit,
                               overlap_events, intra_op_parallelism,
                               engine=engine, direct=direct,
                               staging_bytes=staging_bytes, gds=cls._GDS)
        self._locked = {}
        self._completions = None
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

    def new_cpu_locked_tensor(self, num_elem, example_tensor, *, allow_unlocked=False):
        """A 1-D CPU tensor of ``num_elem`` elements of ``example_tensor``'s dtype.

        The memory is page-aligned, zeroed and page-locked (also with
        CPU-only PyTorch builds), so ``is_pinned()`` is True for it, as
        DeepSpeed expects. When RLIMIT_MEMLOCK (``ulimit -l``) does not allow
        locking it, NvioError (ENOMEM) names the limit and how to raise it;
        ``allow_unlocked=True`` (nvio's addition) returns unlocked memory
        instead, for which ``is_pinned()`` is False. The memory is freed
        exactly once, when the last tensor using it is gone;
        ``free_cpu_locked_tensor`` drops the handle's reference. A NumPy
        example gives a NumPy array.
        """
        if self.closed:
            raise ValueError("nvio: I/O operation on a closed handle")
        n = operator.index(num_elem)
        if n < 0:
            raise ValueError(f"nvio: num_elem must be >= 0, not {n}")
        unlocked_ok = _nvio.check_flag(allow_unlocked, "allow_unlocked")
        if _is_torch_tensor(example_tensor):
            import torch
            dtype = example_tensor.dtype
            esize = example_tensor.element_size()
            buf = _locked_buffer(n * esize, unlocked_ok)
            if n == 0:
                return torch.empty(0, dtype=dtype)
            t = torch.frombuffer(buf, dtype=dtype, count=n)
            key = t.data_ptr()
        elif _is_numpy_array(example_tensor):
            import numpy as np
            dtype = example_tensor.dtype
            buf = _locked_buffer(n * dtype.itemsize, unlocked_ok)
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

    def get_thread_count(self):
        """DeepSpeed before 2024 (``thread_count``): the same as
        ``get_intra_op_parallelism()``."""
        return self.get_intra_op_parallelism()

    def is_pinned(self, tensor):
        """True if the tensor's memory is page-locked (nvio or torch pinned),
        DeepSpeed's meaning: I/O on it needs no bounce buffer."""
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

    def submit_async(self, ops, *, refused="raise"):
        """Submit many tagged ops at once; one :class:`nvio.NvioFuture` per op.

        Each op is ``(opcode, file, buf, offset[, user_data[, flags[, crc32]]])`` as for
        ``Handle.submit`` (``user_data`` ends up as ``future.user_data``).
        ``refused="future"`` turns an op refused at submit into a failed
        future instead of raising. The handle's one reaper thread resolves
        them; ``wait()`` does not see these ops.
        """
        return completions(self).submit(ops, refused=refused)

    def close(self):
        """Resolve every outstanding future, stop the reaper, close the
        handle's files, wait for ops in flight, free the handle and drop
        locked-tensor refs."""
        c = getattr(self, "_completions", None)
        if c is not None:
            c.close()
            self._completions = None
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


def _locked_buffer(nbytes, unlocked_ok):
    """A LockedBuffer that really is locked, or NvioError naming the limit."""
    if unlocked_ok or nbytes == 0:
        return _nvio.LockedBuffer(nbytes)
    try:
        return _nvio.LockedBuffer(nbytes, require_locked=True)
    except OSError as e:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        show = lambda v: "unlimited" if v == resource.RLIM_INFINITY else f"{v} bytes"
        raise _nvio.NvioError(
            e.errno or errno.ENOMEM,
            f"nvio: cannot lock {nbytes} bytes of memory: RLIMIT_MEMLOCK (ulimit -l) is "
            f"{show(soft)} (hard limit {show(hard)}); raise it (ulimit -l unlimited, "
            f"/etc/security/limits.conf memlock, docker --ulimit memlock=-1, or "
            f"LimitMEMLOCK= in systemd) or pass allow_unlocked=True to accept "
            f"memory that is not page-locked") from e


def _find_cufile():
    """Point libnvio at the libcufile the nvidia-cufile wheel ships, if any,
    through nvio_cufile_set_library (libnvio loads it at run time; the
    environment is left alone, and NVIO_CUFILE_LIB set by the user wins)."""
    import glob
    import os
    if os.environ.get("NVIO_CUFILE_LIB"):
        return
    for d in sys.path:
        hits = sorted(glob.glob(os.path.join(d, "nvidia", "cu*", "lib", "libcufile.so*")) +
                      glob.glob(os.path.join(d, "nvidia", "cufile", "lib", "libcufile.so*")))
        if hits:
            try:
                _nvio.cufile_set_library(hits[0])
            except OSError:
                pass    # cuFile already loaded from elsewhere: that one stays
            return


def gds_mode():
    """('direct' | 'compat' | 'none', why): how GdsHandle moves CUDA tensors.

    'direct' is true GPUDirect Storage (nvidia-fs), 'compat' cuFile's
    compatibility mode, 'none' means GdsHandle stages through locked host
    buffers like AioHandle (why says what is missing).
    """
    _find_cufile()
    return _nvio.gds_mode()


def _cuda_tensor(t, what):
    if not (_is_torch_tensor(t) and t.is_cuda):
        raise TypeError(f"nvio: {what} needs a CUDA torch.Tensor, not "
                        f"{getattr(t, 'device', type(t).__name__)}")
    if not t.is_contiguous():
        raise ValueError(f"nvio: {what} needs a contiguous tensor")
    return t.data_ptr(), t.numel() * t.element_size()


class GdsHandle(AioHandle):
    """DeepNVMe's ``gds_handle``: the methods of AioHandle, with CUDA tensors
    moved by NVIDIA cuFile (GPUDirect Storage) when it is usable.

    Where cuFile is missing or refuses, CUDA tensors go through locked host
    bounce buffers instead (``uses_gds()`` and ``get_engine_note()`` say
    which; :func:`nvio.gds_mode` says why). CPU tensors take the host path.
    Registering tensors (``pin_device_tensor``) is optional: it makes GDS
    transfers faster, and unregistered tensors work too.
    """
    __slots__ = ("_pinned",)
    _GDS = True

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls, *args, **kwargs)
        self._pinned = {}
        return self

    def new_pinned_device_tensor(self, num_elem, example_tensor):
        """An uninitialised 1-D CUDA tensor of ``num_elem`` elements of the
        example's dtype (on the example's device if it is a CUDA tensor),
        registered with cuFile."""
        import torch
        n = operator.index(num_elem)
        if n < 0:
            raise ValueError(f"nvio: num_elem must be >= 0, not {n}")
        device = example_tensor.device if example_tensor.is_cuda else "cuda"
        t = torch.empty(n, dtype=example_tensor.dtype, device=device)
        if n:
            self.pin_device_tensor(t)
        return t

    def free_pinned_device_tensor(self, tensor):
        """Deregister a tensor from new_pinned_device_tensor; torch frees the
        memory when the tensor goes. Returns True."""
        if tensor.numel():
            self.unpin_device_tensor(tensor)
        return True

    def pin_device_tensor(self, tensor):
        """Register a CUDA tensor's memory with cuFile. Returns True."""
        addr, n = _cuda_tensor(tensor, "pin_device_tensor")
        _nvio.gds_register(addr, n)
        self._pinned[addr] = tensor   # keep the memory alive while registered
        return True

    def unpin_device_tensor(self, tensor):
        """Undo pin_device_tensor. Returns True."""
        addr, _ = _cuda_tensor(tensor, "unpin_device_tensor")
        _nvio.gds_deregister(addr)
        self._pinned.pop(addr, None)
        return True

    def close(self):
        """Wait for ops in flight, free the handle, deregister pinned tensors."""
        super().close()   # first: no op may still use a registered buffer
        for addr in list(self._pinned):
            try:
                _nvio.gds_deregister(addr)
            except OSError:
                pass
        self._pinned.clear()


gds_handle = GdsHandle

