"""Streams (File.stream) and nvio.open() file objects, torch.save/torch.load through them.

Every I/O test runs on every engine with direct I/O on and off; bytes are
checked with Python's own file I/O and tensors with a plain torch.load of
the path (never nvio against itself).
"""
import io
import os

import pytest

import nvio
from nvio_testutil import pattern, read_file, same, write_file

BUF = 65536
SIZES = [0, 1, 4095, 4096, 4097, BUF - 1, BUF, BUF + 1, 3 * BUF + 4097]
CHUNKS = [1, 7, 4096, 5000, BUF + 3]


def _chunks(data, step):
    return [data[i:i + step] for i in range(0, len(data), step)]


@pytest.mark.parametrize("size", SIZES)
def test_stream_roundtrip(handle, tmp_path, size):
    p = tmp_path / "s.bin"
    data = pattern(size, 1)
    step = CHUNKS[size % len(CHUNKS)]
    with handle.open(p, nvio.FILE_WRITE | nvio.FILE_CREATE | nvio.FILE_READ) as f:
        s = f.stream("w", 0, BUF)
        for c in _chunks(data, step):
            assert s.write(c) == len(c)
        assert s.tell() == size
        s.close()
        assert read_file(p) == data
        with f.stream("r", 0, BUF) as r:
            got = bytearray()
            while True:
                b = bytearray(step)
                n = r.readinto(b)
                if not n:
                    break
                got += b[:n]
            assert bytes(got) == data
            r.seek(size // 3)
            assert r.read(10) == data[size // 3:size // 3 + 10]


def test_stream_writer_from_offset_and_big_writes(handle, np, tmp_path):
    p = tmp_path / "o.bin"
    write_file(p, b"H" * 5000)
    big = np.frombuffer(pattern(4 * BUF + 100, 2), np.uint8)
    with handle.open(p, nvio.FILE_WRITE) as f:
        with f.stream("w", 5000, BUF) as s:
            s.write(b"x")
            s.write(big)                        # larger than a buffer
            s.flush()
            s.write(b"tail")
    assert read_file(p) == b"H" * 5000 + b"x" + big.tobytes() + b"tail"


def test_stream_misuse(handle, tmp_path):
    p = tmp_path / "m.bin"
    write_file(p, b"abc")
    with handle.open(p) as f:
        with pytest.raises(ValueError):
            f.stream("w")                       # not open for writing
        with pytest.raises(ValueError):
            f.stream("x")
        s = f.stream("r")
        with pytest.raises(ValueError):
            s.write(b"no")
        f.close()                               # closes its streams first
        assert s.closed
        with pytest.raises(ValueError):
            s.read(1)


@pytest.mark.parametrize("size", [0, 4095, 4097, BUF + 1])
def test_open_rb_wb_roundtrip(handle, np, tmp_path, size):
    p = tmp_path / "o.bin"
    data = pattern(size, 3)
    with nvio.open(p, "wb", handle=handle, buffer_bytes=BUF) as f:
        assert f.writable() and not f.readable() and not f.seekable()
        parts = _chunks(data, 1000)
        for i, c in enumerate(parts):
            kind = i % 4
            obj = (c if kind == 0 else bytearray(c) if kind == 1 else
                   memoryview(c) if kind == 2 else np.frombuffer(c, np.uint8))
            assert f.write(obj) == len(c)
        assert f.tell() == size
    assert read_file(p) == data
    with nvio.open(p, "rb", handle=handle, buffer_bytes=BUF) as f:
        assert f.readable() and f.seekable()
        assert f.read() == data
        assert f.read() == b""
        assert f.seek(0) == 0
        assert f.read(5) == data[:5]
        pos = f.tell()
        assert pos == min(5, size)
        assert f.seek(3, io.SEEK_CUR) == pos + 3
        assert f.read(4) == data[pos + 3:pos + 7]
        f.seek(-min(10, size), io.SEEK_END)
        assert f.read() == data[-10:]
        b = bytearray(100)
        f.seek(1)
        n = f.readinto(b)
        assert bytes(b[:n]) == data[1:101]
    assert not handle.closed                    # a given handle stays open


def test_open_atomic_and_in_place(handle, tmp_path):
    p = tmp_path / "a.bin"
    write_file(p, b"old content")
    with pytest.raises(KeyError):
        with nvio.open(p, "wb", handle=handle) as f:
            f.write(b"partial")
            raise KeyError("boom")
    assert read_file(p) == b"old content"       # abandoned
    f = nvio.open(p, "wb", handle=handle)
    f.write(b"dropped")
    del f                                       # never closed: abandoned too
    assert read_file(p) == b"old content"
    f = nvio.open(p, "wb", handle=handle)
    f.write(b"new")
    assert read_file(p) == b"old content"       # untouched until close
    f.close()
    assert read_file(p) == b"new"
    with nvio.open(p, "wb", handle=handle, atomic=False, fsync=True) as f:
        assert read_file(p) == b""              # truncated at open
        f.write(b"in place")
    assert read_file(p) == b"in place"
    with pytest.raises(ValueError):
        nvio.open(p, "ab")
    with pytest.raises(FileNotFoundError):
        nvio.open(tmp_path / "missing", "rb")


def _state_dict(torch):
    g = torch.Generator().manual_seed(0)
    sd = {"layers": [{"w": torch.randn(64, 33, generator=g),
                      "b": torch.randn(33, generator=g).to(torch.bfloat16),
                      "ids": torch.arange(i * 7 + 1)} for i in range(40)],
          "emb": torch.randn(1000, 17, generator=g),
          "step": 12, "flags": torch.tensor([True, False]),
          "nested": {"half": torch.randn(5, 5, generator=g).half(),
                     "i8": torch.randint(-128, 127, (4097,), dtype=torch.int8, generator=g),
                     "empty": torch.empty(0)}}
    return sd


def _equal(torch, a, b):
    return same(a, b)


def test_torch_save_load_through_nvio_open(handle, torch, tmp_path):
    p = tmp_path / "sd.pt"
    sd = _state_dict(torch)
    with nvio.open(p, "wb", handle=handle, buffer_bytes=BUF) as f:
        torch.save(sd, f)
    assert _equal(torch, torch.load(p), sd)                  # plain torch.load(path)
    with nvio.open(p, "rb", handle=handle, buffer_bytes=BUF) as f:
        assert _equal(torch, torch.load(f), sd)
    with nvio.open(p, "rb", handle=handle) as f:
        assert _equal(torch, torch.load(f, weights_only=True), sd)
    q = tmp_path / "plain.pt"
    torch.save(sd, q)                                        # a plain save, read by nvio
    with nvio.open(q, "rb", handle=handle) as f:
        assert _equal(torch, torch.load(f, weights_only=True), sd)


def test_torch_save_default_handle(torch, tmp_path):
    p = tmp_path / "d.pt"
    sd = _state_dict(torch)
    with nvio.open(p, "wb") as f:
        torch.save(sd, f)
    assert _equal(torch, torch.load(p, weights_only=True), sd)
    with nvio.open(str(p), "rb") as f:
        assert _equal(torch, torch.load(f), sd)
    with pytest.raises(RuntimeError):
        with nvio.open(p, "wb") as f:
            torch.save({"x": torch.ones(3)}, f)
            raise RuntimeError("interrupted")
    assert _equal(torch, torch.load(p, weights_only=True), sd)   # the old checkpoint
