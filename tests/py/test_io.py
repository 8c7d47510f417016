"""Round trips on every engine, direct on and off, odd sizes and offsets.

Every test checks the bytes (against Python's own file I/O), not only the
return codes.
"""
import errno
import os

import pytest

import nvio
from nvio_testutil import pattern, read_file, write_file

SIZES = [0, 1, 511, 4097, (1 << 20) + 1]
OFFSETS = [0, 1, 4097]


def _torch_from(torch, data):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.empty(0, dtype=torch.uint8)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("offset", OFFSETS)
def test_torch_sync_roundtrip(handle, torch, tmp_path, size, offset):
    f = tmp_path / "t.bin"
    data = pattern(size, 1)
    t = _torch_from(torch, data)
    assert handle.sync_pwrite(t, str(f), offset) == 1
    got = read_file(f)
    if size:                                    # (an empty write need not extend)
        assert len(got) == offset + size
        assert got[offset:] == data
        assert got[:offset] == b"\0" * offset   # a hole reads as zeros
    if len(got) < offset:
        return                                  # empty range past EOF: see test_errors
    u = torch.full((size,), 7, dtype=torch.uint8)
    assert handle.sync_pread(u, str(f), offset) == 1
    assert bytes(u.numpy()) == data


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("offset", OFFSETS)
def test_numpy_pread_pwrite(handle, np, tmp_path, size, offset):
    f = tmp_path / "n.bin"
    base = pattern(offset + size + 100, 2)
    write_file(f, base)
    data = pattern(size, 3)
    a = np.frombuffer(data, dtype=np.uint8).copy()
    assert handle.pwrite(a, str(f), False, False, offset) == 1
    got = read_file(f)
    # pwrite never truncates: the bytes around the range are untouched.
    assert got == base[:offset] + data + base[offset + size:]
    b = np.zeros(size, dtype=np.uint8)
    assert handle.pread(b, str(f), False, False, offset) == 1
    assert b.tobytes() == data


@pytest.mark.parametrize("size", [0, 4097, (1 << 20) + 1])
def test_validate(handle, np, tmp_path, size):
    f = tmp_path / "v.bin"
    a = np.frombuffer(pattern(size, 4), dtype=np.uint8).copy()
    assert handle.pwrite(a, str(f), True, False) == 1
    b = np.zeros_like(a)
    assert handle.pread(b, str(f), True, False) == 1
    assert b.tobytes() == a.tobytes()
    assert handle.pwrite(a, str(f), True, True) == 0
    assert handle.wait() == 1


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16",
                                   "int8", "int64", "bool", "complex64"])
def test_torch_dtypes(handle, torch, tmp_path, dtype):
    f = tmp_path / "d.bin"
    dt = getattr(torch, dtype)
    src = torch.frombuffer(bytearray(pattern(4096 * 3, 5)), dtype=torch.uint8)
    if dtype == "bool":
        t = (src % 2).to(torch.bool)
    else:
        t = src.view(dt).clone()
    handle.sync_pwrite(t, str(f))
    assert read_file(f) == bytes(t.view(torch.uint8).numpy()) if dtype != "bool" \
        else read_file(f) == bytes(t.to(torch.uint8).numpy())
    u = torch.empty_like(t)
    handle.sync_pread(u, str(f))
    assert torch.equal(u.view(torch.uint8) if dtype != "bool" else u, t.view(torch.uint8)
                       if dtype != "bool" else t)


def test_torch_multidim_and_offset_view(handle, torch, tmp_path):
    f = tmp_path / "m.bin"
    big = torch.arange(1000, dtype=torch.int32)
    view = big[3:803].view(20, 40)        # contiguous, storage offset 3
    handle.sync_pwrite(view, str(f))
    assert read_file(f) == bytes(big[3:803].numpy())
    out = torch.zeros(20, 40, dtype=torch.int32)
    handle.sync_pread(out, str(f))
    assert torch.equal(out, view)


def test_async_queue_several_ops(handle, torch, tmp_path):
    n = 8
    srcs = [_torch_from(torch, pattern(4097 * (i + 1), 10 + i)) for i in range(n)]
    for i, t in enumerate(srcs):
        assert handle.async_pwrite(t, str(tmp_path / f"a{i}")) == 0
    assert handle.wait() == n
    assert handle.wait() == 0
    for i, t in enumerate(srcs):
        assert read_file(tmp_path / f"a{i}") == bytes(t.numpy())
    dsts = [torch.zeros_like(t) for t in srcs]
    for i, t in enumerate(dsts):
        assert handle.async_pread(t, str(tmp_path / f"a{i}")) == 0
    assert handle.pending() == n
    assert handle.wait() == n
    assert handle.pending() == 0
    for s, d in zip(srcs, dsts):
        assert torch.equal(s, d)


def test_async_many_ops_one_file(handle, np, tmp_path):
    f = tmp_path / "pieces.bin"
    data = pattern(64 * 1000 + 7, 11)
    pieces = [np.frombuffer(data[i:i + 1000], dtype=np.uint8) for i in range(0, len(data), 1000)]
    for i, p in enumerate(pieces):
        handle.pwrite(p, str(f), False, True, i * 1000)
    assert handle.wait() == len(pieces)
    assert read_file(f) == data
    outs = [np.zeros(len(p), np.uint8) for p in pieces]
    for i, o in enumerate(outs):
        handle.pread(o, str(f), async_op=True, file_offset=i * 1000)
    assert handle.wait() == len(pieces)
    assert b"".join(o.tobytes() for o in outs) == data


def test_async_keyword_spellings(handle, np, tmp_path):
    f = tmp_path / "k.bin"
    a = np.arange(100, dtype=np.int64)
    assert handle.pwrite(a, str(f), **{"async": True}) == 0
    assert handle.wait() == 1
    b = np.zeros_like(a)
    assert handle.pread(buffer=b, filename=str(f), validate=False, async_op=True,
                        file_offset=0) == 0
    assert handle.wait() == 1
    assert (a == b).all()
    c = np.zeros_like(a)
    assert handle.pread(c, str(f), False, **{"async": False}) == 1
    assert (a == c).all()


def test_fd_variants(handle, np, tmp_path):
    f = tmp_path / "fd.bin"
    data = pattern(12345, 12)
    a = np.frombuffer(data, dtype=np.uint8)
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert handle.async_pwrite(a, fd, 10) == 0
        assert handle.wait() == 1
        assert handle.sync_pwrite(a, fd=fd, file_offset=20000) == 1
        os.fstat(fd)                               # still open: never closed by nvio
        got = read_file(f)
        assert got[10:10 + len(data)] == data and got[20000:] == data
        b = np.zeros(len(data), np.uint8)
        assert handle.async_pread(b, fd=fd, file_offset=20000) == 0
        assert handle.wait() == 1
        assert b.tobytes() == data
        c = np.zeros(len(data), np.uint8)
        assert handle.pread(c, fd, False, False, 10) == 1
        assert c.tobytes() == data
    finally:
        os.close(fd)


def test_whole_file_read_write(handle, np, tmp_path):
    f = tmp_path / "w.bin"
    write_file(f, pattern(10000, 13))          # longer than what we write next
    data = pattern(4097, 14)
    a = np.frombuffer(data, dtype=np.uint8)
    assert handle.write(a, str(f), False) == 0
    assert read_file(f) == data                # replaced, not overwritten in place
    b = np.zeros(4097, np.uint8)
    assert handle.read(b, str(f), True) == 0
    assert b.tobytes() == data
    big = np.zeros(5000, np.uint8)             # DeepSpeed: sizes must match
    with pytest.raises(nvio.NvioError, match="4097 bytes.*5000 bytes") as ei:
        handle.read(big, str(f), False)
    assert ei.value.errno == errno.ENODATA and ei.value.filename == str(f)
    assert handle.read(big, str(f), False, allow_short=True) == 4097   # opt-in
    assert big[:4097].tobytes() == data
    part = np.zeros(4097 - 100, np.uint8)
    assert handle.read(part, str(f), False, 100) == 0
    assert part.tobytes() == data[100:]
    assert handle.write(a, str(f), False, fsync=True) == 0


def test_pathlike_and_bytes_names(handle, np, tmp_path):
    a = np.arange(10, dtype=np.uint8)
    handle.sync_pwrite(a, tmp_path / "p1")
    handle.sync_pwrite(a, os.fsencode(str(tmp_path / "p2")))
    assert read_file(tmp_path / "p1") == read_file(tmp_path / "p2") == a.tobytes()


def test_buffer_protocol_objects(handle, tmp_path):
    import array
    f = tmp_path / "b.bin"
    data = pattern(5000, 15)
    handle.sync_pwrite(data, str(f))                       # bytes: read-only is fine
    assert read_file(f) == data
    ba = bytearray(5000)
    handle.sync_pread(ba, str(f))
    assert bytes(ba) == data
    mv = memoryview(bytearray(6000))[1000:]
    handle.sync_pread(mv, str(f))
    assert bytes(mv) == data
    arr = array.array("i", range(100))
    handle.sync_pwrite(arr, str(f))
    assert read_file(f)[:400] == arr.tobytes()
    lb = nvio.LockedBuffer(5000)
    handle.sync_pread(lb, str(f), 0)
    assert bytes(memoryview(lb))[:400] == arr.tobytes()


def test_dlpack_producer(handle, np, tmp_path):
    class Producer:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, *args, **kwargs):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    f = tmp_path / "dl.bin"
    a = np.arange(1000, dtype=np.float32).reshape(10, 100)
    handle.sync_pwrite(Producer(a), str(f))
    assert read_file(f) == a.tobytes()
    b = np.zeros_like(a)
    handle.sync_pread(Producer(b), str(f))
    assert (a == b).all()
    handle.async_pread(Producer(b[3:]), str(f))       # a view with an offset
    assert handle.wait() == 1
    assert (b[3:].ravel() == a.ravel()[:700]).all()


def test_intra_op_parallelism_and_small_blocks(engine, direct, np, tmp_path):
    f = tmp_path / "par.bin"
    data = pattern(3 * (1 << 20) + 333, 16)
    a = np.frombuffer(data, dtype=np.uint8)
    with nvio.AioHandle(block_size=65536 + 512, queue_depth=4, intra_op_parallelism=3,
                        single_submit=True, overlap_events=True, engine=engine,
                        direct=direct) as h:
        assert h.get_intra_op_parallelism() == 3
        h.sync_pwrite(a, str(f), 777)
        assert read_file(f)[777:] == data
        b = np.zeros_like(a)
        h.async_pread(b, str(f), 777)
        assert h.wait() == 1
        assert b.tobytes() == data


def test_locked_tensor_io(handle, torch, tmp_path):
    f = tmp_path / "l.bin"
    t = handle.new_cpu_locked_tensor(3000, torch.empty(0, dtype=torch.float32))
    t.copy_(torch.arange(3000, dtype=torch.float32))
    handle.sync_pwrite(t, str(f))
    u = handle.new_cpu_locked_tensor(3000, torch.empty(0, dtype=torch.float32))
    handle.sync_pread(u, str(f))
    assert torch.equal(t, u)
    assert handle.free_cpu_locked_tensor(t) and handle.free_cpu_locked_tensor(u)
