"""The simulated CUDA driver and cuFile (tests/sim/) for the Python tests.

torch's CPU build has no CUDA tensors, so where torch has no usable GPU
the GPU tests use :class:`DeviceBuffer`: simulated device memory (a host
access faults) behind the few tensor methods nvio's extension calls
(data_ptr, numel, element_size, is_contiguous). libnvio finds it to be
device memory through the simulated driver, loaded into the process as
libcuda.so.1 (RTLD_GLOBAL, as torch loads the real one), and moves it
through its bounce buffers or, for GdsHandle, the simulated cuFile.

The libraries come from $NVIO_SIM_DIR, else build/tests/sim of this tree
(``make sim``), else they are compiled here with $CC (cc). With
NVIO_TEST_REQUIRE_SIM=1 (CI) a simulator that cannot be had fails the
tests instead of skipping them.
"""
import ctypes
import os
import shutil
import subprocess
import tempfile
import threading

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_sim = None


def _build(src_dir):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler to build the simulator (set CC)")
    out = tempfile.mkdtemp(prefix="nvio-sim-")
    cuda = os.path.join(out, "libcuda.so.1")
    flags = ["-std=c11", "-D_GNU_SOURCE", "-O1", "-fPIC", "-shared", "-pthread"]
    subprocess.run([cc, *flags, "-o", cuda, os.path.join(src_dir, "libcuda.c"),
                    "-Wl,-soname,libcuda.so.1"], check=True)
    subprocess.run([cc, *flags, "-o", os.path.join(out, "libcufile.so.0"),
                    os.path.join(src_dir, "libcufile.c"), "-Wl,-soname,libcufile.so.0",
                    "-Wl,--no-as-needed", cuda, "-Wl,-rpath,$ORIGIN", "-ldl"], check=True)
    return out


def _find():
    d = os.environ.get("NVIO_SIM_DIR")
    if d:
        return d
    d = os.path.join(ROOT, "build", "tests", "sim")
    if all(os.path.exists(os.path.join(d, f)) for f in ("libcuda.so.1", "libcufile.so.0")):
        return d
    src = os.path.join(ROOT, "tests", "sim")
    if not os.path.exists(os.path.join(src, "libcuda.c")):
        raise RuntimeError("tests/sim/ not found beside the tests")
    return _build(src)


class Sim:
    def __init__(self, d):
        import nvio
        self.dir = d
        self.cuda = ctypes.CDLL(os.path.join(d, "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
        self.cufile_path = os.path.join(d, "libcufile.so.0")
        self.cufile = ctypes.CDLL(self.cufile_path)
        c = self.cuda
        c.sim_cuda_alloc.restype = ctypes.c_void_p
        c.sim_cuda_alloc.argtypes = [ctypes.c_int, ctypes.c_size_t]
        c.sim_cuda_free.argtypes = [ctypes.c_void_p]
        for f in ("peek", "poke"):
            getattr(c, "sim_cuda_" + f).argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                                   ctypes.c_size_t]
        c.sim_cuda_fill.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        for f in ("copies", "violations", "queued", "pageable_copies", "host_registered"):
            getattr(c, "sim_cuda_" + f).restype = ctypes.c_ulong
        c.sim_cuda_ctx_refs.restype = ctypes.c_long
        for lib, name in ((c, "sim_cuda_fail"), (self.cufile, "sim_cufile_fail")):
            getattr(lib, name).argtypes = [ctypes.c_char_p, ctypes.c_ulong,
                                           ctypes.c_ulong, ctypes.c_int]
        for f in ("ios", "violations"):
            getattr(self.cufile, "sim_cufile_" + f).restype = ctypes.c_ulong
        for f in ("handles", "bufs"):
            getattr(self.cufile, "sim_cufile_" + f).restype = ctypes.c_long
        try:
            nvio.cufile_set_library(self.cufile_path)
        except OSError:
            pass    # loaded already (this one, or a system's: gds_mode says)

    def alloc(self, n, device=0):
        p = self.cuda.sim_cuda_alloc(device, n)
        if not p:
            raise MemoryError(f"simulated device memory: {n} bytes")
        return p

    def copies(self):
        return self.cuda.sim_cuda_copies()

    def violations(self):
        return self.cuda.sim_cuda_violations() + self.cufile.sim_cufile_violations()

    def cufile_ios(self):
        return self.cufile.sim_cufile_ios()

    def fail(self, fn, after=0, times=1, code=999):
        self.cuda.sim_cuda_fail(fn.encode(), after, times, code)


def load():
    """The simulator, loaded once; skips (or fails, NVIO_TEST_REQUIRE_SIM=1)
    where it cannot be had."""
    global _sim
    if _sim is None:
        try:
            _sim = Sim(_find())
        except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
            if os.environ.get("NVIO_TEST_REQUIRE_SIM") == "1":
                pytest.fail(f"CUDA simulator required (NVIO_TEST_REQUIRE_SIM=1): {e}")
            pytest.skip(f"no CUDA simulator: {e}")
    return _sim


class DeviceBuffer:
    """Simulated device memory that nvio takes as a (duck-typed) tensor.

    Its bytes are read and written only through the simulator's back door
    (``bytes()``, ``copy_from``); a slice shares the memory.
    """

    def __init__(self, sim, nbytes, element_size=1, _base=None, _off=0):
        self.sim = sim
        self._esize = element_size
        self.nbytes = nbytes
        self._base = _base
        self._owner = _base is None
        self.ptr = sim.alloc(max(nbytes, 1)) if _base is None else _base.ptr + _off

    def data_ptr(self):
        return self.ptr

    def numel(self):
        return self.nbytes // self._esize

    def element_size(self):
        return self._esize

    def is_contiguous(self):
        return True

    def slice(self, off, n):
        return DeviceBuffer(self.sim, n, 1, _base=self, _off=off)

    def bytes(self):
        b = ctypes.create_string_buffer(self.nbytes)
        assert self.sim.cuda.sim_cuda_peek(b, ctypes.c_void_p(self.ptr), self.nbytes) == 0
        return b.raw

    def copy_from(self, data):
        assert len(data) == self.nbytes
        assert self.sim.cuda.sim_cuda_poke(ctypes.c_void_p(self.ptr), data, len(data)) == 0

    def fill(self, byte):
        assert self.sim.cuda.sim_cuda_fill(ctypes.c_void_p(self.ptr), byte, self.nbytes) == 0

    def __del__(self):
        if self._owner and self.ptr:
            self.sim.cuda.sim_cuda_free(ctypes.c_void_p(self.ptr))
            self.ptr = 0


class TorchProvider:
    """Simulated device memory for nvio's applications on torch's CPU build
    (installed with ``nvio._device._set_provider``): a storage nvio.load or
    nvio.safetensors.load_file allocates for a "cuda" destination is a CPU
    torch storage over simulated device memory. torch never reads it (a
    load only builds views); libnvio finds it to be device memory through
    the simulated driver and fills it through its GPU paths. The tests read
    it back with :meth:`bytes` (the simulator's back door)."""

    def __init__(self, sim):
        import torch
        self.torch = torch
        self.sim = sim
        sim.cuda.sim_cuda_range.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                            ctypes.POINTER(ctypes.c_size_t)]
        sim.cuda.sim_cuda_allocations.restype = ctypes.c_ulong
        sim.cuda.sim_cuda_shadow.restype = ctypes.c_void_p
        sim.cuda.sim_cuda_shadow.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.POINTER(ctypes.c_int)]
        c = sim.cuda
        c.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_size_t]
        c.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        c.cuDevicePrimaryCtxRelease_v2.argtypes = [ctypes.c_int]
        c.cuCtxPushCurrent_v2.argtypes = [ctypes.c_void_p]
        c.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        c.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_ulonglong, ctypes.c_void_p,
                                           ctypes.c_size_t, ctypes.c_void_p]
        c.cuMemcpyDtoHAsync_v2.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong,
                                           ctypes.c_size_t, ctypes.c_void_p]
        c.cuMemcpyHtoD_v2.argtypes = [ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_size_t]
        c.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        c.cuStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
        for f in ("cuEventSynchronize", "cuEventDestroy_v2", "cuStreamSynchronize",
                  "cuStreamDestroy_v2", "cuMemHostUnregister"):
            getattr(c, f).argtypes = [ctypes.c_void_p]
        c.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        c.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        c.cuEventCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        self.d2h = 0        # copies made by copy_to_host (torch's, on a GPU)
        self.h2d = 0        # asynchronous copies queued by copy_to_device_async
        self.h2d_sync = 0   # copies made by copy_to_device
        self._lock = threading.Lock()

    def is_available(self):
        return True

    def empty(self, nbytes, device):
        if nbytes == 0:
            return self.torch.UntypedStorage(0)
        buf = DeviceBuffer(self.sim, nbytes)
        arr = (ctypes.c_ubyte * nbytes).from_address(buf.ptr)
        arr.device_buffer = buf     # freed when torch lets go of the array
        return self.torch.frombuffer(arr, dtype=self.torch.uint8).untyped_storage()

    def owns(self, storage):
        """Whether a storage's (or tensor's) memory is simulated device memory."""
        if storage.nbytes() == 0:
            return False
        base, n = ctypes.c_void_p(), ctypes.c_size_t()
        return self.sim.cuda.sim_cuda_range(ctypes.c_void_p(storage.data_ptr()),
                                            ctypes.byref(base), ctypes.byref(n)) == 0

    def bytes(self, t):
        """The bytes of a contiguous tensor or storage in device memory."""
        n = t.nbytes() if callable(t.nbytes) else t.nbytes
        b = ctypes.create_string_buffer(n)
        if n and self.sim.cuda.sim_cuda_peek(b, ctypes.c_void_p(t.data_ptr()), n) != 0:
            raise ValueError("not simulated device memory: %#x (%d bytes)" % (t.data_ptr(), n))
        return b.raw

    def device_index(self, storage):
        dev = ctypes.c_int(-1)
        if not self.sim.cuda.sim_cuda_shadow(ctypes.c_void_p(storage.data_ptr()), 1,
                                             ctypes.byref(dev)):
            raise ValueError("not simulated device memory: %#x" % storage.data_ptr())
        return dev.value

    def copy_to_host(self, dst, src, n):
        """What torch's CUDA copy to the host does: cuMemcpyDtoH in the
        device's primary context, made current for the call (counted in
        ``d2h``, and in the simulator's copies)."""
        c = self.sim.cuda
        dev = ctypes.c_int(-1)
        if not c.sim_cuda_shadow(ctypes.c_void_p(src), n, ctypes.byref(dev)):
            raise ValueError("not simulated device memory: %#x (%d bytes)" % (src, n))
        ctx, old = ctypes.c_void_p(), ctypes.c_void_p()
        for r in (c.cuInit(0), c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value)):
            if r:
                raise RuntimeError("simulated CUDA driver: error %d" % r)
        try:
            if c.cuCtxPushCurrent_v2(ctx):
                raise RuntimeError("simulated CUDA driver: cuCtxPushCurrent failed")
            try:
                r = c.cuMemcpyDtoH_v2(dst, src, n)
            finally:
                c.cuCtxPopCurrent_v2(ctypes.byref(old))
        finally:
            c.cuDevicePrimaryCtxRelease_v2(dev.value)
        if r:
            raise RuntimeError("simulated CUDA driver: cuMemcpyDtoH: error %d" % r)
        with self._lock:
            self.d2h += 1

    # -- streams and events, as torch.cuda's (nvio._device's stream seam) --
    # All in device 0's primary context, retained while the provider has
    # streams or events (close() releases it) and made current per call.

    def _ctx(self):
        c = self.sim.cuda
        if getattr(self, "_primary", None) is None:
            ctx = ctypes.c_void_p()
            for r in (c.cuInit(0), c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)):
                if r:
                    raise RuntimeError("simulated CUDA driver: error %d" % r)
            self._primary, self._streams, self._events = ctx, {}, []
        return self._primary

    def _call(self, name, *args):
        c = self.sim.cuda
        old = ctypes.c_void_p()
        if c.cuCtxPushCurrent_v2(self._ctx()):
            raise RuntimeError("simulated CUDA driver: cuCtxPushCurrent failed")
        try:
            r = getattr(c, name)(*args)
        finally:
            c.cuCtxPopCurrent_v2(ctypes.byref(old))
        if r:
            raise RuntimeError("simulated CUDA driver: %s: error %d" % (name, r))

    def current_device(self):
        return 0

    def new_stream(self, index):
        assert index == 0, index
        st = ctypes.c_void_p()
        self._call("cuStreamCreate", ctypes.byref(st), 1)      # CU_STREAM_NON_BLOCKING
        self._streams.setdefault("all", []).append(st)
        return st

    def current_stream(self, index):
        """The stream "torch's kernels" run on (one per provider)."""
        self._ctx()
        if "current" not in self._streams:
            self._streams["current"] = self.new_stream(index)
        return self._streams["current"]

    def record(self, stream):
        ev = ctypes.c_void_p()
        self._call("cuEventCreate", ctypes.byref(ev), 0)
        self._events.append(ev)
        self._call("cuEventRecord", ev, stream)
        return ev

    def wait_event(self, stream, event):
        self._call("cuStreamWaitEvent", stream, event, 0)

    def event_synchronize(self, event):
        self._call("cuEventSynchronize", event)

    def stream_synchronize(self, stream):
        self._call("cuStreamSynchronize", stream)

    def copy_to_device_async(self, dst, src, n, stream):
        self.h2d += 1
        self._call("cuMemcpyHtoDAsync_v2", ctypes.c_ulonglong(dst), ctypes.c_void_p(src),
                   ctypes.c_size_t(n), stream)

    def copy_to_device(self, dst, src, n):
        """cuMemcpyHtoD, as ``cuda_tensor.copy_(cpu_tensor)`` (counted in h2d_sync)."""
        self.h2d_sync += 1
        self._call("cuMemcpyHtoD_v2", ctypes.c_ulonglong(dst), ctypes.c_void_p(src),
                   ctypes.c_size_t(n))

    def copy_to_host_async(self, dst, src, n, stream):
        """What a kernel reading device memory on stream does (the tests'
        stand-in for the model's work): a copy queued on it."""
        self._call("cuMemcpyDtoHAsync_v2", ctypes.c_void_p(dst), ctypes.c_ulonglong(src),
                   ctypes.c_size_t(n), stream)

    def host_register(self, address, n):
        self._call("cuMemHostRegister_v2", ctypes.c_void_p(address), ctypes.c_size_t(n), 0)

    def host_unregister(self, address):
        self._call("cuMemHostUnregister", ctypes.c_void_p(address))

    def to_device(self, t, index):
        """A contiguous copy of a host tensor in device memory (synchronous
        cuMemcpyHtoD, as tensor.to("cuda"))."""
        t = t.contiguous()
        n = t.numel() * t.element_size()
        st = self.empty(n, self.torch.device("cuda", index))
        if n:
            self._call("cuMemcpyHtoD_v2", ctypes.c_ulonglong(st.data_ptr()),
                       ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(n))
        return self.torch.empty(0, dtype=t.dtype).set_(st, 0, t.shape)

    def close(self):
        """Destroy the streams and events made here and release the
        context (their queued work still runs)."""
        if getattr(self, "_primary", None) is None:
            return
        c = self.sim.cuda
        for ev in self._events:
            c.cuEventDestroy_v2(ev)
        for st in self._streams.get("all", []):
            self._call("cuStreamDestroy_v2", st)
        c.cuDevicePrimaryCtxRelease_v2(0)
        self._primary = None

    def to_host(self, storage):
        return self.torch.frombuffer(bytearray(self.bytes(storage)),
                                     dtype=self.torch.uint8).untyped_storage()

    def allocations(self):
        """Simulated device allocations alive now."""
        return self.sim.cuda.sim_cuda_allocations()
