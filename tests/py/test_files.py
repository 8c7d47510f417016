"""Open files, vectors and tagged ops (Handle.open, File, submit/reap).

Every test runs on every engine with direct I/O on and off (the `handle`
fixture) and checks bytes against Python's own file I/O.
"""
import errno
import gc
import os
import random
import select
import weakref

import pytest

import nvio
from nvio import _nvio
from nvio_testutil import pattern, read_file, write_file

RW = nvio.FILE_READ | nvio.FILE_WRITE | nvio.FILE_CREATE


@pytest.mark.parametrize("size", [0, 1, 4095, 4097, (1 << 20) + 1])
@pytest.mark.parametrize("offset", [0, 4097])
def test_pwrite_pread(handle, tmp_path, size, offset):
    p = tmp_path / "f.bin"
    data = pattern(size, 1)
    with handle.open(p, RW) as f:
        assert f.pwrite(data, offset) == size
        if size:
            assert f.size == offset + size
        got = read_file(p)
        if size:
            assert got == b"\0" * offset + data
        back = bytearray(size)
        if size:
            assert f.pread(back, offset) == size
            assert bytes(back) == data


def test_pread_past_end_raises_enodata(handle, tmp_path):
    p = tmp_path / "short.bin"
    write_file(p, b"x" * 100)
    with handle.open(p) as f:
        with pytest.raises(nvio.NvioError) as ei:
            f.pread(bytearray(200), 0)
    e = ei.value
    assert e.errno == errno.ENODATA
    assert e.filename == p
    assert e.offset is not None


def _pieces(seed, n, lo=1, hi=3000):
    r = random.Random(seed)
    return [r.randint(lo, hi) for _ in range(n)]


def test_vectors_thousands_of_odd_numpy_pieces(handle, np, tmp_path):
    p = tmp_path / "v.bin"
    sizes = _pieces(1, 2000)
    blob = pattern(sum(sizes), 2)
    arrs, o = [], 0
    for s in sizes:
        arrs.append(np.frombuffer(blob, np.uint8, s, o).copy())
        o += s
    with handle.open(p, RW) as f:
        assert f.pwritev(arrs, 123) == len(blob)
        assert read_file(p) == b"\0" * 123 + blob
        outs = [np.zeros(s, np.uint8) for s in sizes]
        assert f.preadv(outs, 123) == len(blob)
    assert b"".join(a.tobytes() for a in outs) == blob


def test_vectors_per_iov_torch(handle, torch, tmp_path):
    p = tmp_path / "pv.bin"
    sizes = _pieces(3, 1500, 1, 2000)
    blob = pattern(sum(sizes), 4)
    pairs, expect, off, o = [], bytearray(), 7, 0
    for i, s in enumerate(sizes):
        t = torch.frombuffer(bytearray(blob[o:o + s]), dtype=torch.uint8)
        gap = i % 3                       # holes between some pieces
        off += gap
        expect += b"\0" * gap
        pairs.append((t, off))
        expect += blob[o:o + s]
        off += s
        o += s
    with handle.open(p, RW) as f:
        assert f.pwritev(pairs, nvio.OFFSET_PER_IOV) == len(blob)
        assert read_file(p)[7:] == bytes(expect)
        outs = [(torch.zeros(t.numel(), dtype=torch.uint8), o2) for t, o2 in pairs]
        f.preadv(outs, nvio.OFFSET_PER_IOV)
    for (a, _), (b, _) in zip(pairs, outs):
        assert torch.equal(a, b)


def test_submit_reap_many_tags(handle, np, tmp_path):
    p = tmp_path / "s.bin"
    n, sz = 200, 4099
    blob = pattern(n * sz, 5)
    write_file(p, blob)
    with handle.open(p, nvio.FILE_READ) as f:
        bufs = [np.zeros(sz, np.uint8) for _ in range(n)]
        ops = [(nvio.OP_READ, f, bufs[i], i * sz, ("t", i)) for i in range(n)]
        done = 0
        while done < n:
            done += handle.submit(ops[done:])
        assert handle.inflight == n
        seen = {}
        while len(seen) < n:
            for tag, res in handle.reap(64, 1, 10):
                assert tag not in seen
                seen[tag] = res
        assert handle.inflight == 0
        assert handle.reap(64, 0, 0) == []
    assert seen == {("t", i): sz for i in range(n)}
    for i, b in enumerate(bufs):
        assert b.tobytes() == blob[i * sz:(i + 1) * sz]


def test_submit_write_vector_op_and_fsync(handle, np, tmp_path):
    p = tmp_path / "w.bin"
    pieces = [np.frombuffer(pattern(s, s), np.uint8).copy() for s in (1, 4096, 333, 70000)]
    with handle.open(p, RW) as f:
        assert handle.submit([(nvio.OP_WRITE, f, pieces, 10, "v", nvio.FSYNC),
                              (nvio.OP_WRITE, f, b"head", 0, "h")]) == 2
        got = dict(handle.reap(8, 2, 10))
    assert got == {"v": sum(a.size for a in pieces), "h": 4}
    assert read_file(p) == b"head" + b"\0" * 6 + b"".join(a.tobytes() for a in pieces)


def test_submit_refusal_first_raises_later_returns_count(handle, tmp_path):
    p = tmp_path / "r.bin"
    write_file(p, pattern(8192, 6))
    with handle.open(p) as f:
        ok = [bytearray(4096), bytearray(4096)]
        ops = [(nvio.OP_READ, f, ok[0], 0, 0), (nvio.OP_READ, f, ok[1], 4096, 1),
               (nvio.OP_READ, f, bytearray(100), 8150, 2)]
        assert handle.submit(ops) == 2
        with pytest.raises(nvio.NvioError) as ei:
            handle.submit(ops[2:])
        assert ei.value.errno == errno.ENODATA
        assert ei.value.filename == p
        assert ei.value.offset == 8150
        assert handle.inflight == 2
        assert sorted(handle.reap(8, 2, 10)) == [(0, 4096), (1, 4096)]


def test_reap_failure_is_nvio_error_with_details(engine):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with nvio.AioHandle(engine=engine, direct=False) as h:
        f = h.open("/dev/full", nvio.FILE_WRITE)
        assert h.submit([(nvio.OP_WRITE, f, b"x" * 5000, 0, "full")]) == 1
        [(tag, res)] = h.reap(4, 1, 10)
    assert tag == "full"
    assert isinstance(res, nvio.NvioError)
    assert res.errno == errno.ENOSPC
    assert res.filename == "/dev/full"
    assert res.is_write and res.offset == 0


def test_submit_keeps_buffers_alive_until_reaped(handle, torch, tmp_path):
    p = tmp_path / "k.bin"
    data = pattern((3 << 20) + 5, 7)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    ref = weakref.ref(t)
    with handle.open(p, RW) as f:
        handle.submit([(nvio.OP_WRITE, f, t, 0, "t")])
        del t
        gc.collect()
        assert ref() is not None              # borrowed until reaped
        assert handle.reap(1, 1, 10) == [("t", len(data))]
    gc.collect()
    assert ref() is None
    assert read_file(p) == data


def test_close_handle_with_tagged_ops_in_flight(engine, direct, np, tmp_path):
    h = nvio._nvio.Handle(engine=engine, direct=direct)
    p = tmp_path / "c.bin"
    f = h.open(p, RW)
    a = np.frombuffer(pattern(8 << 20, 8), np.uint8).copy()
    ref = weakref.ref(a)
    assert h.submit([(nvio.OP_WRITE, f, a, 0, None)]) == 1
    del a
    h.close()                                 # waits, then releases the borrow
    gc.collect()
    assert ref() is None
    assert f.closed
    assert h.inflight == 0
    assert read_file(p) == pattern(8 << 20, 8)
    with pytest.raises(ValueError):
        f.pread(bytearray(1), 0)


def test_atomic_commit_and_abandon(handle, tmp_path):
    p = tmp_path / "a.bin"
    write_file(p, b"old")
    f = handle.open(p, nvio.FILE_ATOMIC)
    f.pwrite(b"new content", 0)
    f.close()                                 # no commit: abandoned
    assert read_file(p) == b"old"
    with pytest.raises(RuntimeError):
        with handle.open(p, nvio.FILE_ATOMIC) as f:
            f.pwrite(b"new content", 0)
            raise RuntimeError("boom")
    assert read_file(p) == b"old"
    with handle.open(p, nvio.FILE_ATOMIC) as f:   # success: committed at exit
        f.pwrite(b"new content", 0)
    assert read_file(p) == b"new content"
    f = handle.open(p, nvio.FILE_ATOMIC)
    f.pwrite(b"third", 0)
    f.commit()
    assert f.committed
    assert read_file(p) == b"third"
    with pytest.raises(ValueError):
        f.commit()
    f.close()
    f.close()                                 # idempotent


def test_open_fd_truncate_allocate_sync_info(handle, tmp_path):
    p = tmp_path / "fd.bin"
    write_file(p, pattern(10000, 9))
    fd = os.open(p, os.O_RDWR)
    try:
        with handle.open_fd(fd, nvio.FILE_READ | nvio.FILE_WRITE) as f:
            assert f.path == "fd %d" % fd
            assert f.size == 10000
            f.pwrite(b"abc", 5)
            f.truncate(5000)
            f.allocate(0, 8192)               # fallocate: may grow, bytes kept
            f.sync()
            info = f.info()
            assert info["size"] == os.fstat(fd).st_size == 8192
            assert set(info) >= {"flags", "fd", "direct", "size", "committed"}
        os.fstat(fd)                          # never closed by nvio
    finally:
        os.close(fd)
    d = pattern(10000, 9)
    assert read_file(p) == d[:5] + b"abc" + d[8:5000] + b"\0" * 3192


def test_open_errors(handle, tmp_path):
    with pytest.raises(FileNotFoundError) as ei:
        handle.open(tmp_path / "missing")
    assert isinstance(ei.value, nvio.NvioError)
    with pytest.raises(ValueError):
        handle.open(tmp_path / "x", 0)
    with pytest.raises(TypeError):
        nvio.File()


def test_completion_fd(handle, tmp_path):
    p = tmp_path / "e.bin"
    write_file(p, pattern(4096, 10))
    fd = handle.completion_fd()
    with handle.open(p) as f:
        b = bytearray(4096)
        handle.submit([(nvio.OP_READ, f, b, 0, "e")])
        r, _, _ = select.select([fd], [], [], 10)
        assert r == [fd]
        got = []
        while not got:
            got = handle.reap(4, 0, 0)
        assert got == [("e", 4096)]
    assert bytes(b) == pattern(4096, 10)


class _DLPackOnly:
    """A producer with nothing but DLPack (no buffer protocol, no tensor methods)."""

    def __init__(self, arr):
        self._a = arr

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_vector_of_mixed_buffer_kinds(handle, np, torch, tmp_path):
    p = tmp_path / "mix.bin"
    blob = pattern(50000, 11)
    cuts = [0, 1, 4097, 10000, 23456, 40000, 50000]
    chunks = [blob[a:b] for a, b in zip(cuts, cuts[1:])]
    locked = nvio.LockedBuffer(len(chunks[5]))
    memoryview(locked)[:] = chunks[5]
    srcs = [chunks[0], bytearray(chunks[1]), memoryview(chunks[2]),
            _DLPackOnly(np.frombuffer(chunks[3], np.uint8).copy()),
            torch.frombuffer(bytearray(chunks[4]), dtype=torch.uint8), locked]
    with handle.open(p, RW) as f:
        assert f.pwritev(srcs, 0) == len(blob)
        assert read_file(p) == blob
        outs = [bytearray(len(c)) for c in chunks[:3]] + \
               [_DLPackOnly(np.zeros(len(chunks[3]), np.uint8)),
                torch.zeros(len(chunks[4]), dtype=torch.uint8),
                nvio.LockedBuffer(len(chunks[5]))]
        assert f.preadv(outs, 0) == len(blob)
    got = b"".join([bytes(outs[0]), bytes(outs[1]), bytes(outs[2]), outs[3]._a.tobytes(),
                    bytes(outs[4].numpy()), bytes(memoryview(outs[5]))])
    assert got == blob


def test_vector_argument_errors(handle, tmp_path):
    with handle.open(tmp_path / "va.bin", RW) as f:
        with pytest.raises(ValueError, match="at least one"):
            f.pwritev([], 0)
        with pytest.raises(ValueError, match="piece 1"):
            f.pwritev([(b"ab", 0), (b"cd", 1)], nvio.OFFSET_PER_IOV)
        with pytest.raises(ValueError, match="piece 1"):
            handle.submit([(nvio.OP_WRITE, f, [(b"ab", 10), (b"cd", 0)], -1)])
        with pytest.raises(TypeError):
            f.pwritev([b"ab"], nvio.OFFSET_PER_IOV)        # pairs needed
        with pytest.raises(ValueError):
            f.pwritev([b"x"], -5)
        with pytest.raises(ValueError):
            handle.submit([(7, f, b"", 0)])
        with pytest.raises(TypeError):
            f.pread(b"read-only", 0)
        assert handle.inflight == 0
        assert f.pwritev([b"", b""], 0) == 0
