"""Error cases: every failure is a Python exception, never a crash or -1."""
import errno
import os

import pytest

import nvio
from nvio_testutil import pattern, write_file


def test_missing_file_is_enoent_with_filename(handle, np, tmp_path):
    f = str(tmp_path / "nope" / "missing.bin")
    a = np.zeros(10, np.uint8)
    for call in (lambda: handle.sync_pread(a, f),
                 lambda: handle.async_pread(a, f),
                 lambda: handle.pread(a, f, False, True),
                 lambda: handle.read(a, f, False)):
        with pytest.raises(FileNotFoundError) as ei:
            call()
        e = ei.value
        assert isinstance(e, nvio.NvioError) and isinstance(e, OSError)
        assert type(e) is nvio.NvioFileNotFoundError
        assert e.errno == errno.ENOENT
        assert e.filename == f
        assert isinstance(e.op, str) and e.op
        assert e.offset == 0
    assert handle.pending() == 0                  # rejected ops never complete
    assert handle.wait() == 0
    with pytest.raises(FileNotFoundError):        # a missing directory on write
        handle.sync_pwrite(a, f)


def test_read_past_eof(handle, np, tmp_path):
    f = tmp_path / "short.bin"
    write_file(f, pattern(1000))
    a = np.zeros(1001, np.uint8)
    with pytest.raises(nvio.NvioError) as ei:
        handle.sync_pread(a, str(f))
    assert ei.value.errno == errno.ENODATA and ei.value.filename == str(f)
    b = np.zeros(10, np.uint8)
    with pytest.raises(nvio.NvioError) as ei:
        handle.async_pread(b, str(f), 995)
    assert ei.value.errno == errno.ENODATA
    assert handle.wait() == 0
    assert b.tobytes() == bytes(10)                # nothing was read
    c = np.zeros(500, np.uint8)
    with pytest.raises(nvio.NvioError) as ei:      # whole file larger than buffer
        handle.read(c, str(f), False)
    assert ei.value.errno == errno.EOVERFLOW
    handle.sync_pread(b, str(f), 990)               # the last bytes are fine


def test_empty_range_past_eof(handle, np, tmp_path):
    f = tmp_path / "empty.bin"
    write_file(f, b"")
    a = np.zeros(0, np.uint8)
    assert handle.sync_pread(a, str(f), 0) == 1
    try:                                          # either answer is consistent
        handle.sync_pread(a, str(f), 5)
    except nvio.NvioError as e:
        assert e.errno == errno.ENODATA


def test_non_contiguous(handle, torch, np, tmp_path):
    f = str(tmp_path / "nc.bin")
    t = torch.arange(100, dtype=torch.float32).view(10, 10).t()
    with pytest.raises(ValueError, match="contiguous"):
        handle.sync_pwrite(t, f)
    with pytest.raises(ValueError, match="contiguous"):
        handle.async_pread(t, f)
    with pytest.raises(ValueError, match="contiguous"):
        handle.sync_pwrite(torch.arange(10)[::2], f)
    a = np.arange(100, dtype=np.float32).reshape(10, 10).T
    with pytest.raises(ValueError, match="contiguous"):
        handle.sync_pwrite(a, f)
    with pytest.raises(ValueError, match="contiguous"):
        handle.sync_pread(np.zeros(20)[::2], f)
    with pytest.raises(ValueError, match="contiguous"):
        handle.sync_pwrite(memoryview(bytearray(20))[::2], f)
    assert handle.pending() == 0
    assert not os.path.exists(f)


def test_negative_offset(handle, np, tmp_path):
    f = str(tmp_path / "neg.bin")
    a = np.zeros(10, np.uint8)
    handle.sync_pwrite(a, f)
    for call in (handle.sync_pread, handle.sync_pwrite, handle.async_pread,
                 handle.async_pwrite):
        with pytest.raises(ValueError, match="file_offset"):
            call(a, f, -1)
    with pytest.raises(ValueError):
        handle.pread(a, f, False, False, -4096)
    with pytest.raises(ValueError):
        handle.read(a, f, False, -1)
    with pytest.raises(OverflowError):
        handle.sync_pread(a, f, 1 << 64)
    assert handle.wait() == 0


def test_closed_and_bad_fd(handle, np, tmp_path):
    f = tmp_path / "fd.bin"
    write_file(f, pattern(100))
    a = np.zeros(10, np.uint8)
    fd = os.open(f, os.O_RDONLY)
    os.close(fd)
    for call in (lambda: handle.sync_pread(a, fd), lambda: handle.sync_pwrite(a, fd),
                 lambda: handle.async_pread(a, fd=fd), lambda: handle.pread(a, -1)):
        with pytest.raises(nvio.NvioError) as ei:
            call()
        assert ei.value.errno == errno.EBADF
    assert handle.wait() == 0


def test_write_to_read_only_fd(handle, np, tmp_path):
    f = tmp_path / "ro.bin"
    write_file(f, pattern(100))
    a = np.ones(10, np.uint8)
    fd = os.open(f, os.O_RDONLY)
    try:
        with pytest.raises(nvio.NvioError) as ei:
            handle.sync_pwrite(a, fd)
        assert ei.value.errno == errno.EBADF
        try:
            handle.async_pwrite(a, fd)
            with pytest.raises(nvio.NvioError) as ei:
                handle.wait()
        except nvio.NvioError as e:                 # rejected at submit is fine too
            ei = pytest.ExceptionInfo.from_exc_info((type(e), e, None))
        assert ei.value.errno == errno.EBADF
        assert handle.wait() == 0
    finally:
        os.close(fd)


def test_wrong_types(handle, np, tmp_path):
    f = str(tmp_path / "wt.bin")
    a = np.zeros(10, np.uint8)
    for bad in (None, 3, "text", 1.5, [1, 2], object()):
        with pytest.raises(TypeError):
            handle.sync_pwrite(bad, f)
    for badname in (None, 1.5, [f], object(), True):
        with pytest.raises(TypeError):
            handle.sync_pwrite(a, badname)
    with pytest.raises(ValueError):               # embedded NUL
        handle.sync_pwrite(a, "a\0b")
    with pytest.raises(TypeError, match="read-only"):
        handle.sync_pread(b"0123456789", f)        # cannot read into bytes
    ro = np.zeros(10, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="read-only"):
        handle.sync_pread(ro, f)
    with pytest.raises(TypeError):
        handle.pread(a, f, False, True, async_op=True)   # given twice
    with pytest.raises(TypeError):
        handle.pread(a, f, async_op=True, **{"async": True})
    with pytest.raises(TypeError):
        handle.sync_pread(a, f, fd=3)                     # both
    with pytest.raises(TypeError):
        handle.sync_pread(a)                              # neither
    with pytest.raises(TypeError):
        handle.sync_pread(a, f, "0")
    with pytest.raises(TypeError):
        handle.sync_pread(a, f, fsync=True)
    assert handle.pending() == 0


def test_unusable_device_tensors_rejected(handle, torch, tmp_path):
    """CUDA tensors are taken where CUDA works (tests/py/test_gpu.py); where
    it does not, a tensor claiming to be on CUDA is one clear error, never a
    device pointer mistaken for host memory. Other devices are refused."""
    class FakeDevice:
        type = "cuda"

        def __str__(self):
            return "cuda:0"

    class FakeCudaTensor:
        device = FakeDevice()

        def data_ptr(self):
            return 0x1000

        def element_size(self):
            return 4

        def numel(self):
            return 10

        def is_contiguous(self):
            return True

    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no usable CUDA"):
            handle.sync_pwrite(FakeCudaTensor(), str(tmp_path / "c.bin"))
    with pytest.raises(TypeError, match="meta"):
        handle.sync_pwrite(torch.empty(10, device="meta"), str(tmp_path / "c.bin"))

    class FakeDL:
        def __dlpack__(self, **kw):
            raise AssertionError("must not be called")

        def __dlpack_device__(self):
            return (2, 0)

    with pytest.raises(TypeError, match="cuda"):
        handle.sync_pwrite(FakeDL(), str(tmp_path / "c.bin"))


def test_sparse_and_conj_rejected(handle, torch, tmp_path):
    f = str(tmp_path / "s.bin")
    with pytest.raises(ValueError):
        handle.sync_pwrite(torch.eye(3).to_sparse(), f)
    z = torch.ones(4, dtype=torch.complex64).conj()
    with pytest.raises(ValueError, match="conj"):
        handle.sync_pwrite(z, f)
    handle.sync_pwrite(z.resolve_conj(), f)
    with pytest.raises(ValueError, match="negative"):
        handle.sync_pwrite(torch._neg_view(torch.ones(4)), f)
    with pytest.raises(ValueError, match="layout"):     # after a strided one
        handle.sync_pwrite(torch.eye(3).to_sparse(), f)


def test_closed_handle(np, tmp_path):
    h = nvio.AioHandle()
    h.close()
    h.close()                                       # idempotent
    assert h.closed
    a = np.zeros(10, np.uint8)
    for call in (lambda: h.sync_pwrite(a, str(tmp_path / "x")), h.wait, h.get_block_size,
                 h.get_engine, h.pending, lambda: h.read(a, "x", False)):
        with pytest.raises(ValueError, match="closed"):
            call()
    with nvio.AioHandle() as h2:
        assert not h2.closed
    assert h2.closed
    with pytest.raises(ValueError):
        with h2:
            pass


def test_bad_configuration():
    for kwargs in ({"block_size": 0}, {"block_size": -1}, {"queue_depth": 0},
                   {"intra_op_parallelism": 0}, {"intra_op_parallelism": 100000},
                   {"queue_depth": 1 << 40}, {"engine": "floppy"}, {"direct": "maybe"}):
        with pytest.raises((ValueError, OverflowError)):
            nvio.AioHandle(**kwargs)
    with pytest.raises(TypeError):
        nvio.AioHandle(engine=1.5)
    with pytest.raises(TypeError):
        nvio.AioHandle(1, 2, 3, 4, 5, 6)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_error_at_completion_raised_by_wait(engine, np):
    """A write that fails in the kernel is reported by wait() with its details."""
    a = np.ones(10000, np.uint8)
    # libaio cannot do AIO on a character device: the kernel says EINVAL.
    expected = {errno.ENOSPC} | ({errno.EINVAL} if engine == "libaio" else set())
    with nvio.AioHandle(engine=engine, direct=False) as h:
        assert h.async_pwrite(a, "/dev/full") == 0
        with pytest.raises(nvio.NvioError) as ei:
            h.wait()
        e = ei.value
        assert e.errno in expected
        assert e.filename == "/dev/full"
        assert e.op == "pwrite" and e.is_write and e.offset == 0
        assert h.wait() == 0                      # every op ended
        with pytest.raises(nvio.NvioError) as ei:
            h.sync_pwrite(a, "/dev/full")
        assert ei.value.errno in expected and ei.value.filename == "/dev/full"
        str(ei.value)                             # formats without error


def test_threads_sharing_a_handle_get_their_own_errors(engine, np, tmp_path):
    """Each thread's exception describes its own failure (path, offset),
    however the other threads' calls on the same handle failed meanwhile."""
    import threading
    nthreads, tries = 4, 200
    wrong = []
    with nvio.AioHandle(engine=engine) as h:
        def worker(k):
            f = tmp_path / ("own-%d.bin" % k)
            write_file(f, pattern(100))
            a = np.zeros(1, np.uint8)
            for i in range(tries):
                off = 100 + 1000 * k + i
                try:
                    h.sync_pread(a, str(f), off)
                except nvio.NvioError as e:
                    if (e.errno != errno.ENODATA or e.offset != off
                            or str(f) not in str(e)):
                        wrong.append((k, i, e.errno, e.offset, str(e)))
                else:
                    wrong.append((k, i, "no error"))
                missing = str(tmp_path / ("missing-%d-%d" % (k, i)))
                try:
                    h.sync_pread(a, missing)
                except FileNotFoundError as e:
                    if missing not in str(e):
                        wrong.append((k, i, str(e)))
        ths = [threading.Thread(target=worker, args=(k,)) for k in range(nthreads)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
    assert not wrong, wrong[:3]
