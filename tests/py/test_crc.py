"""nvio's CRC-32 (libnvio's nvio_crc32 through the extension) against
zlib: random lengths and alignments (0 and odd sizes included), every
buffer kind the extension takes, continuation, combine, the CRC-32s a
tagged op takes of its buffers as it moves them (every engine), and the
CRCs nvio.save stores checked by Python's zipfile."""
import random
import zipfile
import zlib

import numpy as np
import pytest
import torch

import nvio
from nvio import _nvio


def _lengths():
    rng = random.Random(18)
    fixed = [0, 1, 2, 3, 7, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1023, 4097,
             65535, 65536, 65537, (1 << 20) + 3]
    return fixed + [rng.randrange(0, 1 << 18) for _ in range(40)]


def test_crc32_equals_zlib_over_lengths_and_alignments():
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (1 << 20) + 64, dtype=np.uint8).tobytes()
    mv = memoryview(data)
    for n in _lengths():
        for a in (0, 1, 3, 8, 13):
            b = mv[a:a + n]
            assert _nvio.crc32(b) == zlib.crc32(b), (n, a)
            assert _nvio.crc32(b, 0x9ABCDEF0) == zlib.crc32(b, 0x9ABCDEF0), (n, a)


def test_crc32_buffer_kinds():
    t = torch.arange(300001, dtype=torch.int32)
    want = zlib.crc32(t.numpy().tobytes())
    assert _nvio.crc32(t) == want                      # tensor
    assert _nvio.crc32(t.numpy()) == want              # buffer protocol
    assert _nvio.crc32(bytearray(t.numpy().tobytes())) == want
    assert _nvio.crc32(t[1:]) == zlib.crc32(t[1:].numpy().tobytes())   # offset view
    assert _nvio.crc32(torch.empty(0)) == 0
    with pytest.raises(ValueError):
        _nvio.crc32(t[::2])                            # not contiguous
    with pytest.raises(ValueError):
        _nvio.crc32(b"x", 1 << 32)
    with pytest.raises(TypeError):
        _nvio.crc32(12)


def test_crc32_continues_and_combines():
    rng = np.random.default_rng(2)
    data = rng.integers(0, 256, 3_000_017, dtype=np.uint8).tobytes()
    whole = zlib.crc32(data)
    for cut in (0, 1, 4095, 1_000_003, len(data)):
        a, b = data[:cut], data[cut:]
        assert _nvio.crc32(b, _nvio.crc32(a)) == whole
        assert _nvio.crc32_combine(_nvio.crc32(a), _nvio.crc32(b), len(b)) == whole
    assert _nvio.crc32_combine(whole, 0, 0) == whole


def _page_aligned(n, seed):
    """A float32 tensor of n values whose memory starts on a page (torch's
    own start 64 bytes past one): libnvio writes it without a bounce copy."""
    raw = np.empty(4 * n + 4096, dtype=np.uint8)
    k = -raw.ctypes.data % 4096
    a = raw[k:k + 4 * n].view(np.float32)
    a[:] = np.random.default_rng(seed).standard_normal(n, dtype=np.float32)
    t = torch.from_numpy(a)
    assert t.data_ptr() % 4096 == 0
    return t


def test_saved_checkpoint_crcs_pass_zipfile(handle, tmp_path):
    """Every engine and direct mode: records of every size (small ones
    checksummed whole, large ones in libnvio's op with their unaligned
    ends joined), from torch's memory (bounced) and page-aligned memory
    (moved straight, checksummed by the worker)."""
    sd = {"w%d" % i: torch.randn(1000 * i + 7) for i in range(1, 20)}
    sd["big"] = torch.randn(10 << 20)          # 40 MiB: many pieces joined
    sd["aligned"] = _page_aligned((3 << 20) + 5, 1)
    sd["aligned_small"] = _page_aligned(70000, 2)
    sd["empty"] = torch.empty(0)
    p = tmp_path / "ck.pt"
    from nvio.checkpoint import _save
    assert not _save._packs(nvio._base.plan.Plan(sd, p)), "the direct path is under test"
    nvio.save(sd, p, handle=handle)
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None             # reads every record, checks its CRC
        for info in z.infolist():
            assert info.CRC == zlib.crc32(z.read(info.filename))
    got = torch.load(p)
    assert all(torch.equal(got[k], sd[k]) for k in sd)


def test_crc32_many_equals_zlib_per_region():
    rng = np.random.default_rng(3)
    bufs = [rng.integers(0, 256, n, dtype=np.uint8) for n in (0, 1, 17, 4096, 300001)]
    regions = [(b.ctypes.data, b.nbytes) for b in bufs]
    assert _nvio.crc32_many(regions) == [zlib.crc32(b.tobytes()) for b in bufs]
    assert _nvio.crc32_many([]) == []
    with pytest.raises(TypeError):
        _nvio.crc32_many([(1, 2, 3)])
    with pytest.raises(ValueError):
        _nvio.crc32_many([(0, 5)])


def test_crc_submit_splits_and_joins():
    """The checkpoint code's CRC batches: regions cut into CRC_CHUNK pieces,
    dealt to threads, joined again, equal zlib's CRC of each region."""
    from nvio._base import crc
    rng = np.random.default_rng(4)
    bufs = [rng.integers(0, 256, n, dtype=np.uint8) for n in
            (5, 0, crc.CRC_CHUNK * 2 + 3, 1 << 20, crc.CRC_CHUNK, 77)]
    got = crc.crc_submit([(b.ctypes.data, b.nbytes) for b in bufs])()
    assert got == [zlib.crc32(b.tobytes()) for b in bufs]


def test_crc_submit_waits_for_every_batch_before_raising(monkeypatch):
    """A failed batch is raised only once the others have ended: the caller
    frees the memory they read (or copy into) as soon as result() returns."""
    import threading
    import time
    from nvio._base import crc
    monkeypatch.setattr(crc, "executor", lambda pool=crc.CrcPool(2): pool)
    ended = threading.Event()
    calls = []

    def batch(regions):
        calls.append(len(regions))
        if len(calls) == 1:
            raise MemoryError("first batch")
        time.sleep(0.3)
        ended.set()
        return [0] * len(regions)
    monkeypatch.setattr(_nvio, "crc32_many", batch)
    bufs = [np.zeros(1000, dtype=np.uint8) for _ in range(4)]
    wait = crc.crc_submit([(b.ctypes.data, b.nbytes) for b in bufs])
    with pytest.raises(MemoryError, match="first batch"):
        wait()
    assert len(calls) == 2
    assert ended.is_set()


def test_save_error_before_the_write_waits_for_the_crc_batches(tmp_path, monkeypatch):
    """nvio.save whose tensor write fails to start: nothing reads the
    tensors once the error comes out (CRC batches of their own once did,
    after the tensors were freed with the call's dict: the process
    crashed; libnvio's op takes the CRCs now, and never started), and the
    old file stays."""
    import threading
    import time
    from nvio import _futures
    ended = threading.Event()
    started = []
    orig = _nvio.crc32_many

    def slow(regions):
        started.append(1)
        time.sleep(0.3)
        out = orig(regions)
        ended.set()
        return out

    def refuse(self, bufs, offset, flags=0, crc32=None):
        raise OSError(5, "injected: no write today")
    p = tmp_path / "ck.pt"
    nvio.save({"old": torch.ones(3)}, p)
    before = p.read_bytes()
    monkeypatch.setattr(_nvio, "crc32_many", slow)
    monkeypatch.setattr(_futures.File, "pwritev_async", refuse)
    # the direct path, whatever decides between it and the windows (whose
    # errors test_checkpoint_small tests)
    from nvio.checkpoint import _save
    monkeypatch.setattr(_save, "_packs", lambda plan: False)
    with pytest.raises(OSError, match="injected"):
        nvio.save({"w": torch.randn(1 << 20), "b": torch.randn(300000)}, p)
    assert not started or ended.is_set()
    assert p.read_bytes() == before


# --- the CRC-32 a tagged op takes as it moves its buffers (nvio_op_t.crc32) ---


def _buffers(rng):
    """Buffers of every kind the extension takes, sizes 0 to several
    blocks, at page-aligned and odd addresses."""
    raw = rng.integers(0, 256, 9 << 20, dtype=np.uint8)
    sizes = [0, 1, 7, 4095, 4096, 4097, 65537, (1 << 20) + 3, 0, 2, (3 << 20) + 511]
    sizes += [int(x) for x in rng.integers(0, 200000, 12)]
    out, pos = [], 0
    for i, n in enumerate(sizes):
        pos += -(raw[pos:].ctypes.data) % 4096 + (i * 97) % 512 * (i % 2)
        b = raw[pos:pos + n]
        out.append(b if i % 3 else torch.from_numpy(b.copy()))
        pos += n
    return out


def test_op_crc32_of_each_buffer(handle, tmp_path):
    """pwritev_async / preadv_async with crc32: each buffer's CRC equals
    zlib's over its bytes, for writes (gathered, bounced, moved straight)
    and for reads split another way; the bytes are what was asked."""
    rng = np.random.default_rng(7)
    bufs = _buffers(rng)
    want = [zlib.crc32(np.asarray(b).tobytes()) for b in bufs]
    blob = b"".join(np.asarray(b).tobytes() for b in bufs)
    p = str(tmp_path / "f")
    crcs = __import__("array").array("I", [0xA5A5A5A5] * (len(bufs) + 1))
    with handle.open(p, _nvio.FILE_WRITE | _nvio.FILE_READ | _nvio.FILE_CREATE) as f:
        assert f.pwritev_async(bufs, 0, crc32=crcs).result(30) == len(blob)
        assert list(crcs[:-1]) == want
        assert crcs[-1] == 0xA5A5A5A5              # one past the vector: untouched
        with open(p, "rb") as g:
            assert g.read() == blob
        # read back: one buffer at an odd address, then three pieces with
        # gaps in the file (per-iov offsets)
        into = bytearray(len(blob) + 1)
        one = __import__("array").array("I", [0])
        assert f.preadv_async([memoryview(into)[1:]], 0, crc32=one).result(30) == len(blob)
        assert one[0] == zlib.crc32(blob) and into[1:] == blob
        cuts = [(0, 5000), (9000, 1 << 20), (len(blob) - 70001, 70001)]
        outs = [bytearray(n) for _, n in cuts]
        three = __import__("array").array("I", [0] * 3)
        got = f.preadv_async([(o, a) for o, (a, _) in zip(outs, cuts)], _nvio.OFFSET_PER_IOV,
                             crc32=three).result(30)
        assert got == sum(n for _, n in cuts)
        assert list(three) == [zlib.crc32(blob[a:a + n]) for a, n in cuts]
        assert all(bytes(o) == blob[a:a + n] for o, (a, n) in zip(outs, cuts))


def test_op_crc32_refuses_what_cannot_hold_the_crcs(handle, tmp_path):
    import array
    p = str(tmp_path / "f")
    data = [bytearray(100), bytearray(5000)]
    with handle.open(p, _nvio.FILE_WRITE | _nvio.FILE_CREATE) as f:
        with pytest.raises(ValueError, match="crc32 must hold 8 bytes"):
            f.pwritev_async(data, 0, crc32=array.array("I", [0]))
        with pytest.raises(ValueError, match="4-byte aligned"):
            f.pwritev_async(data, 0, crc32=memoryview(bytearray(12))[1:9])
        with pytest.raises(TypeError, match="crc32 must be a writable buffer"):
            f.pwritev_async(data, 0, crc32=5)
        with pytest.raises((TypeError, BufferError, ValueError)):
            f.pwritev_async(data, 0, crc32=bytes(8))      # read-only
        c = array.array("I", [0, 0])
        assert f.pwritev_async(data, 0, crc32=c).result(30) == 5100
        assert list(c) == [zlib.crc32(bytes(100)), zlib.crc32(bytes(5000))]


def test_op_crc32_of_one_buffer(handle, tmp_path):
    """pwrite_async / pread_async take crc32 too: one uint32."""
    import array
    p = str(tmp_path / "f")
    blob = np.random.default_rng(9).integers(0, 256, (1 << 20) + 77, dtype=np.uint8)
    one = array.array("I", [0])
    with handle.open(p, _nvio.FILE_WRITE | _nvio.FILE_READ | _nvio.FILE_CREATE) as f:
        assert f.pwrite_async(blob[3:], 0, crc32=one).result(30) == blob.size - 3
        assert one[0] == zlib.crc32(blob[3:].tobytes())
        back = bytearray(blob.size - 3)
        one[0] = 0
        assert f.pread_async(back, 0, crc32=one).result(30) == len(back)
        assert one[0] == zlib.crc32(back) == zlib.crc32(blob[3:].tobytes())
        with pytest.raises(ValueError, match="crc32 must hold 4 bytes"):
            f.pwrite_async(blob, 0, crc32=bytearray(2))
