"""GPU paths: device memory through AioHandle (bounce buffers) and
GdsHandle (cuFile, or the bounce path when cuFile is unusable), on every
engine.

With a usable CUDA device in torch, the buffers are CUDA tensors. Without
one (CI), they are simulated device memory (tests/sim/, through
gpusim.DeviceBuffer): a host access faults and copies are asynchronous,
so a missing synchronisation shows as wrong bytes. Every check compares
bytes: the file against the data written, the memory read back against
the memory written.
"""
import os
import random

import pytest

import gpusim
import nvio

try:
    import torch
except ImportError:
    torch = None

REAL = torch is not None and torch.cuda.is_available()
SIZES = [1, 511, 4097, (1 << 20) + 3, (3 << 20) + 1]
OFFSETS = [0, 4095]
HANDLES = [nvio.AioHandle, nvio.GdsHandle]


class Real:
    """CUDA tensors."""
    name = "cuda"

    def rand(self, n, seed, esize=1):
        g = torch.Generator(device="cuda").manual_seed(seed)
        t = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=g)
        return t.view(torch.bfloat16) if esize == 2 else t

    def zeros(self, n, esize=1):
        t = torch.zeros(n, dtype=torch.uint8, device="cuda")
        return t.view(torch.bfloat16) if esize == 2 else t

    def bytes(self, t):
        return bytes(t.view(torch.uint8).cpu().numpy())

    def slice(self, t, off, n):
        return t[off:off + n]

    def check_clean(self):
        pass

    def moved(self, cls):
        return None     # the real driver counts nothing for us


class Simulated:
    """Simulated device memory."""
    name = "sim"

    def __init__(self):
        self.sim = gpusim.load()

    def rand(self, n, seed, esize=1):
        b = gpusim.DeviceBuffer(self.sim, n, esize)
        b.copy_from(random.Random(seed).randbytes(n))
        return b

    def zeros(self, n, esize=1):
        b = gpusim.DeviceBuffer(self.sim, n, esize)
        b.fill(0)
        return b

    def bytes(self, t):
        return t.bytes()

    def slice(self, t, off, n):
        return t.slice(off, n)

    def check_clean(self):
        assert self.sim.violations() == 0

    def moved(self, cls):
        """Driver copies (bounce path) or cuFile calls (GdsHandle) so far."""
        if cls is nvio.GdsHandle and nvio.gds_mode()[0] != "none":
            return self.sim.cufile_ios()
        return self.sim.copies()


@pytest.fixture(scope="module")
def gpu():
    return Real() if REAL else Simulated()


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "gpu.bin")


def make(cls, engine, direct, **kw):
    return cls(engine=engine, direct="on" if direct else "off", **kw)


@pytest.mark.parametrize("cls", HANDLES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("off", OFFSETS)
def test_round_trip_sync(gpu, cls, n, off, path, engine, direct):
    h = make(cls, engine, direct, intra_op_parallelism=2, block_size=1 << 20)
    src = gpu.rand(n, n + off)
    want = gpu.bytes(src)
    moved = gpu.moved(cls)
    assert h.sync_pwrite(src, path, file_offset=off) == 1
    if moved is not None:
        assert gpu.moved(cls) > moved   # the device path, not a host copy
    with open(path, "rb") as f:
        f.seek(off)
        assert f.read(n) == want
    dst = gpu.zeros(n)
    assert h.sync_pread(dst, path, file_offset=off) == 1
    assert gpu.bytes(dst) == want
    h.close()
    gpu.check_clean()


@pytest.mark.parametrize("cls", HANDLES)
def test_async_several_ops_one_wait(gpu, cls, tmp_path, engine):
    h = cls(intra_op_parallelism=4, engine=engine)
    srcs = [gpu.rand((3 << 20) + i * 4097, i) for i in range(6)]
    for i, s in enumerate(srcs):
        assert h.async_pwrite(s, str(tmp_path / f"f{i}")) == 0
    assert h.wait() == len(srcs)
    dsts = [gpu.zeros((3 << 20) + i * 4097) for i in range(6)]
    for i, d in enumerate(dsts):
        assert h.async_pread(d, str(tmp_path / f"f{i}")) == 0
    assert h.wait() == len(srcs)
    for s, d in zip(srcs, dsts):
        assert gpu.bytes(s) == gpu.bytes(d)
    h.close()
    gpu.check_clean()


@pytest.mark.parametrize("cls", HANDLES)
def test_typed_tensor_and_whole_file(gpu, cls, path, engine):
    h = cls(engine=engine)
    src = gpu.rand(2 * 1_000_003, 3, esize=2)
    h.write(src, path, False)
    assert os.path.getsize(path) == 2 * 1_000_003
    dst = gpu.zeros(2 * 1_000_003, esize=2)
    h.read(dst, path, False)
    assert gpu.bytes(src) == gpu.bytes(dst)


@pytest.mark.skipif(not REAL, reason="new_pinned_device_tensor makes torch CUDA tensors")
def test_gds_pinned_tensors(path):
    h = nvio.GdsHandle()
    t = h.new_pinned_device_tensor((8 << 20) + 5, torch.empty(0, dtype=torch.float16))
    assert t.is_cuda and t.dtype == torch.float16
    t.copy_(torch.randn_like(t, dtype=torch.float32).half())
    h.sync_pwrite(t, path)
    u = torch.empty_like(t)
    assert h.pin_device_tensor(u) is True
    h.sync_pread(u, path)
    assert torch.equal(t, u)
    assert h.unpin_device_tensor(u) is True
    assert h.free_pinned_device_tensor(t) is True


def test_gds_registered_buffer_and_slice(gpu, path, engine):
    """Registered device memory (what pin_device_tensor does), and a slice
    of it, which cuFile addresses as the registered base plus an offset."""
    from nvio import _nvio
    h = nvio.GdsHandle(engine=engine)
    big = gpu.rand(4 << 20, 7)
    _nvio.gds_register(big.data_ptr(), 4 << 20)
    part = gpu.slice(big, 12345, 1 << 20)
    before = gpu.sim.cufile_ios() if not REAL else 0
    h.sync_pwrite(part, path)
    with open(path, "rb") as f:
        assert f.read() == gpu.bytes(part)
    out = gpu.slice(big, 3 << 20, 1 << 20)
    h.sync_pread(out, path)
    assert gpu.bytes(out) == gpu.bytes(part)
    if not REAL and nvio.gds_mode()[0] != "none":
        assert gpu.sim.cufile_ios() > before     # through cuFile, not bounced
    _nvio.gds_deregister(big.data_ptr())
    h.close()
    gpu.check_clean()


def test_gds_cpu_tensor_uses_host_path(path):
    torch_ = pytest.importorskip("torch")
    h = nvio.GdsHandle()
    src = torch_.randint(0, 256, (100_001,), dtype=torch_.uint8)
    h.sync_pwrite(src, path)
    dst = torch_.empty_like(src)
    h.sync_pread(dst, path)
    assert torch_.equal(src, dst)


def test_read_past_end_on_gpu_is_an_error(gpu, path):
    h = nvio.AioHandle()
    with open(path, "wb") as f:
        f.write(b"x" * 100)
    dst = gpu.zeros(101)
    with pytest.raises(OSError) as e:
        h.sync_pread(dst, path)
    assert e.value.errno == 61  # ENODATA


@pytest.mark.skipif(REAL, reason="failures are injected into the simulator")
def test_driver_failure_fails_the_op_and_the_handle_goes_on(gpu, path, engine):
    h = nvio.AioHandle(engine=engine)
    src = gpu.rand(1 << 20, 5)
    h.sync_pwrite(src, path)
    dst = gpu.zeros(1 << 20)
    for how in ("cuMemcpyHtoDAsync_v2", "copy"):     # at the call; when it runs
        gpu.sim.fail(how, 0, 1, 999)
        with pytest.raises(OSError) as e:
            h.sync_pread(dst, path)
        assert e.value.errno == 5 and path in str(e.value)
    h.sync_pread(dst, path)
    assert gpu.bytes(dst) == gpu.bytes(src)
    h.close()
    gpu.check_clean()


def test_gds_mode_is_reported(gpu):
    mode, why = nvio.gds_mode()
    assert mode in ("direct", "compat", "none")
    assert why
    if not REAL:
        assert mode != "none", why      # the simulated cuFile is there


@pytest.mark.parametrize("cls", HANDLES)
def test_file_ops_and_futures_on_device_memory(gpu, cls, path, engine):
    n = (5 << 20) + 7
    src = gpu.rand(n, 99)
    want = gpu.bytes(src)
    with cls(engine=engine) as h:
        f = h.open(path, nvio.FILE_READ | nvio.FILE_WRITE | nvio.FILE_CREATE)
        assert f.pwrite(src, 0) == n
        with open(path, "rb") as g:
            assert g.read() == want
        dst = gpu.zeros(n)
        assert f.pread_async(dst, 0).result(60) == n
        assert gpu.bytes(dst) == want
        parts = [gpu.zeros(k) for k in (1, 4096, n - 4097)]
        assert f.preadv(parts, 0) == n
        assert b"".join(gpu.bytes(p) for p in parts) == want
        f.close()
    gpu.check_clean()
