"""nvio's CRC-32 (libnvio's nvio_crc32 through the extension) against
zlib: random lengths and alignments (0 and odd sizes included), every
buffer kind the extension takes, continuation, combine, and the CRCs
nvio.save stores checked by Python's zipfile."""
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


def test_saved_checkpoint_crcs_pass_zipfile(tmp_path):
    sd = {"w%d" % i: torch.randn(1000 * i + 7) for i in range(1, 20)}
    sd["big"] = torch.randn(10 << 20)          # 40 MiB: two CRC chunks combined
    p = tmp_path / "ck.pt"
    nvio.save(sd, p)
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
    """nvio.save whose tensor write fails to start: the CRC batches reading
    the tensors have ended when the error comes out (before, the tensors,
    freed with the call's dict, were still being read: the process crashed),
    and the old file stays."""
    import threading
    import time
    from nvio import _futures
    ended = threading.Event()
    orig = _nvio.crc32_many

    def slow(regions):
        time.sleep(0.3)
        out = orig(regions)
        ended.set()
        return out

    def refuse(self, bufs, offset, flags=0):
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
    assert ended.is_set()
    assert p.read_bytes() == before
