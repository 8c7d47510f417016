"""Tensors of every kind through the fast paths of buffers.c and File.pread.

A torch.Tensor (its type a subclass of torch.Tensor) is sized by .nbytes
and its methods are called without asking first; a duck type is sized by
numel() * element_size(). File.pread/pwrite take two positional arguments
straight from the call and the rest through the argument parser. These
tests compare bytes and addresses, on every engine.
"""
import ctypes

import pytest

import nvio
from nvio_testutil import pattern, write_file


def _open(handle, path, size):
    write_file(path, pattern(size, 3))
    return handle.open(path, nvio.FILE_READ | nvio.FILE_WRITE)


def _kinds(torch):
    class Sub(torch.Tensor):
        pass

    base = torch.zeros(4096 + 64, dtype=torch.uint8)
    yield "plain", torch.zeros(4096, dtype=torch.uint8)
    yield "subclass", torch.zeros(4096, dtype=torch.uint8).as_subclass(Sub)
    yield "parameter", torch.nn.Parameter(torch.zeros(1024), requires_grad=False)
    yield "view-offset", base[64:]           # storage offset 64
    yield "int64", torch.zeros(512, dtype=torch.int64)
    yield "2d", torch.zeros(16, 64, dtype=torch.float32)
    yield "complex", torch.zeros(256, dtype=torch.complex64)
    yield "conj-resolved", torch.zeros(256, dtype=torch.complex64).conj().resolve_conj()


def test_tensor_kinds_read_and_write(handle, torch, tmp_path):
    f = _open(handle, str(tmp_path / "f"), 8192)
    want = pattern(8192, 3)
    for rnd in range(2):    # the second time from the type cache
        for name, t in _kinds(torch):
            n = t.numel() * t.element_size()
            assert nvio.buffer_info(t) == (t.data_ptr(), n), name
            assert f.pread(t, 100) == n, name
            got = t.detach().view(torch.uint8).reshape(-1).numpy().tobytes()
            assert got == want[100:100 + n], (name, rnd)
            assert f.pwrite(t, 4096) == n
            back = bytearray(n)
            assert f.pread(back, 4096) == n
            assert bytes(back) == got, name
            f.pwrite(memoryview(want)[4096:4096 + n], 4096)   # restore
    f.close()


def test_view_with_storage_offset_leaves_the_rest(handle, torch, tmp_path):
    f = _open(handle, str(tmp_path / "f"), 4096)
    base = torch.full((300,), 0xEE, dtype=torch.uint8)
    v = base[100:200]
    assert v.storage_offset() == 100
    f.pread(v, 0)
    assert base[:100].eq(0xEE).all() and base[200:].eq(0xEE).all()
    assert v.numpy().tobytes() == pattern(4096, 3)[:100]
    f.close()


def test_zero_size_tensors(handle, torch, tmp_path):
    f = _open(handle, str(tmp_path / "f"), 4096)
    for t in (torch.empty(0), torch.empty(0, 5, dtype=torch.int16),
              torch.zeros(10)[10:]):
        assert nvio.buffer_info(t)[1] == 0
        assert f.pread(t, 0) == 0
        assert f.pwrite(t, 0) == 0
    f.close()


def test_requires_grad_leaf_is_refused_by_torch_rules(handle, torch, tmp_path):
    """A read into a leaf that requires grad bumps its version; a later
    backward through a graph that saved it fails loudly."""
    f = _open(handle, str(tmp_path / "f"), 4096)
    w = torch.zeros(16, requires_grad=True)
    y = (w * w).sum()       # saves w
    v = w._version
    f.pread(w.detach(), 0)  # the same memory and version counter
    assert w._version > v
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    x = torch.zeros(16)
    z = (x * torch.ones(16, requires_grad=True)).sum()
    f.pread(x, 0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    f.close()


def test_refusals_stay(handle, torch, tmp_path):
    f = _open(handle, str(tmp_path / "f"), 4096)

    class Sub(torch.Tensor):
        pass

    f.pread(torch.zeros(4), 0)      # float32 now known not complex
    f.pread(torch.zeros(4, dtype=torch.complex64), 0)
    for make in (lambda t: t, lambda t: t.as_subclass(Sub)):
        with pytest.raises(ValueError, match="contiguous"):
            f.pread(make(torch.zeros(8, 8)).t(), 0)
        with pytest.raises(ValueError, match="conj"):
            f.pread(make(torch.zeros(4, dtype=torch.complex64)).conj(), 0)
        with pytest.raises(ValueError, match="conj"):
            f.pread(make(torch.zeros(4, dtype=torch.complex128)).conj(), 0)
        with pytest.raises(ValueError, match="conj"):
            f.pread(make(torch._neg_view(torch.zeros(4))), 0)
        with pytest.raises(ValueError, match="conj"):
            f.pread(make(torch._neg_view(torch.zeros(4, dtype=torch.int32))), 0)
    with pytest.raises(ValueError, match="layout"):
        f.pread(torch.eye(3).to_sparse(), 0)
    with pytest.raises(ValueError, match="layout"):
        f.pwrite(torch.eye(3).to_sparse_coo().coalesce(), 0)
    f.close()


def test_duck_type_nbytes_is_not_trusted(handle, tmp_path):
    """Only a torch.Tensor is sized by .nbytes: a duck type's may mean
    anything, numel() * element_size() is what it says it has."""
    f = _open(handle, str(tmp_path / "f"), 4096)
    mem = (ctypes.c_char * 64)()
    guard = (ctypes.c_char * 64).from_buffer(mem)

    class Duck:
        is_cpu = True
        nbytes = 1 << 20    # a lie that would overrun

        def data_ptr(self):
            return ctypes.addressof(mem)

        def numel(self):
            return 16

        def element_size(self):
            return 2

        def is_contiguous(self):
            return True

    assert nvio.buffer_info(Duck()) == (ctypes.addressof(mem), 32)
    assert f.pread(Duck(), 0) == 32
    assert bytes(guard[:32]) == pattern(4096, 3)[:32]
    assert bytes(guard[32:]) == bytes(32)
    f.close()


def test_pread_arguments_every_way(handle, np, tmp_path):
    f = _open(handle, str(tmp_path / "f"), 8192)
    want = pattern(8192, 3)
    a = np.zeros(100, np.uint8)
    for call in (lambda: f.pread(a, 7), lambda: f.pread(a, offset=7),
                 lambda: f.pread(buf=a, offset=7), lambda: f.pread(a, 7, 0),
                 lambda: f.pread(a, 7, flags=0), lambda: f.pread(a, np.int64(7))):
        a[:] = 0
        assert call() == 100
        assert a.tobytes() == want[7:107]
    for bad, exc in ((7.0, TypeError), (-1, ValueError), (2**63, OverflowError),
                     ("7", TypeError)):
        with pytest.raises(exc):
            f.pread(a, bad)
    with pytest.raises(TypeError):
        f.pread(a)
    with pytest.raises(TypeError):
        f.pread(a, 7, 0, 0)
    with pytest.raises(TypeError):
        f.pread(a, 7, bogus=1)
    f.close()
