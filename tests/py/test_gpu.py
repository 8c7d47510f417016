"""GPU paths: CUDA tensors through AioHandle (bounce buffers) and
GdsHandle (cuFile, or the bounce path when cuFile is unusable).

Skips, with the reason, where torch has no usable CUDA device (CI).
Every check compares bytes: the file against a host copy of the data, and
the tensor read back against the tensor written.
"""
import os

import pytest

torch = pytest.importorskip("torch")
import nvio  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

SIZES = [1, 511, 4097, (1 << 20) + 3, (33 << 20) + 1]
OFFSETS = [0, 4095]
HANDLES = [nvio.AioHandle, nvio.GdsHandle]


def rand_gpu(n, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=g)


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "gpu.bin")


@pytest.mark.parametrize("cls", HANDLES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("off", OFFSETS)
def test_round_trip_sync(cls, n, off, path):
    h = cls(intra_op_parallelism=2, block_size=1 << 20)
    src = rand_gpu(n, n + off)
    assert h.sync_pwrite(src, path, file_offset=off) == 1
    with open(path, "rb") as f:
        f.seek(off)
        assert f.read(n) == bytes(src.cpu().numpy())
    dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
    assert h.sync_pread(dst, path, file_offset=off) == 1
    assert torch.equal(src, dst)


@pytest.mark.parametrize("cls", HANDLES)
def test_async_several_ops_one_wait(cls, tmp_path):
    h = cls(intra_op_parallelism=4)
    srcs = [rand_gpu((3 << 20) + i * 4097, i) for i in range(6)]
    for i, s in enumerate(srcs):
        assert h.async_pwrite(s, str(tmp_path / f"f{i}")) == 0
    assert h.wait() == len(srcs)
    dsts = [torch.empty_like(s) for s in srcs]
    for i, d in enumerate(dsts):
        assert h.async_pread(d, str(tmp_path / f"f{i}")) == 0
    assert h.wait() == len(srcs)
    for s, d in zip(srcs, dsts):
        assert torch.equal(s, d)


@pytest.mark.parametrize("cls", HANDLES)
def test_typed_tensor_and_whole_file(cls, path):
    h = cls()
    src = torch.randn(1_000_003, dtype=torch.bfloat16, device="cuda")
    h.write(src, path, False)
    assert os.path.getsize(path) == src.numel() * src.element_size()
    dst = torch.empty_like(src)
    h.read(dst, path, False)
    assert torch.equal(src, dst)


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


def test_gds_slice_of_pinned_tensor(path):
    h = nvio.GdsHandle()
    big = h.new_pinned_device_tensor(4 << 20, torch.empty(0, dtype=torch.uint8))
    big.copy_(rand_gpu(4 << 20, 7))
    part = big[12345:12345 + (1 << 20)]
    h.sync_pwrite(part, path)
    out = torch.empty_like(part)
    h.sync_pread(out, path)
    assert torch.equal(part, out)
    h.free_pinned_device_tensor(big)


def test_gds_cpu_tensor_uses_host_path(path):
    h = nvio.GdsHandle()
    src = torch.randint(0, 256, (100_001,), dtype=torch.uint8)
    h.sync_pwrite(src, path)
    dst = torch.empty_like(src)
    h.sync_pread(dst, path)
    assert torch.equal(src, dst)


def test_read_past_end_on_gpu_is_an_error(path):
    h = nvio.AioHandle()
    with open(path, "wb") as f:
        f.write(b"x" * 100)
    dst = torch.empty(101, dtype=torch.uint8, device="cuda")
    with pytest.raises(OSError) as e:
        h.sync_pread(dst, path)
    assert e.value.errno == 61  # ENODATA


def test_gds_mode_is_reported():
    mode, why = nvio.gds_mode()
    assert mode in ("direct", "compat", "none")
    assert why


@pytest.mark.parametrize("cls", HANDLES)
def test_file_ops_and_futures_on_cuda_tensors(cls, path):
    n = (5 << 20) + 7
    src = rand_gpu(n, 99)
    with cls() as h:
        f = h.open(path, nvio.FILE_READ | nvio.FILE_WRITE | nvio.FILE_CREATE)
        assert f.pwrite(src, 0) == n
        with open(path, "rb") as g:
            assert g.read() == bytes(src.cpu().numpy())
        dst = torch.zeros_like(src)
        assert f.pread_async(dst, 0).result(60) == n
        assert torch.equal(dst, src)
        parts = [torch.zeros(k, dtype=torch.uint8, device="cuda") for k in (1, 4096, n - 4097)]
        assert f.preadv(parts, 0) == n
        assert torch.equal(torch.cat(parts), src)
        f.close()
