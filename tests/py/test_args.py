"""Argument handling: flags are bools (or 0/1), never truthy strings;
limits refused by nvio say what the limit is; property-based checks that
random arguments never crash and either work or raise a clear error."""
import errno
import os

import pytest

import nvio
from nvio_testutil import pattern, write_file


@pytest.mark.parametrize("bad", ["False", "no", "", None, 2, -1, 0.0, [], b"0"])
def test_flags_refuse_non_bools(tmp_path, bad):
    p = str(tmp_path / "f")
    write_file(p, b"x" * 16)
    buf = bytearray(16)
    with nvio.AioHandle() as h:
        for call, name in [
            (lambda: h.pread(buf, p, False, bad), "async_op"),
            (lambda: h.pread(buf, p, bad), "validate"),
            (lambda: h.pwrite(buf, p, **{"async": bad}), "async"),
            (lambda: h.sync_pread(buf, p, validate=bad), "validate"),
            (lambda: h.sync_pwrite(buf, p, fsync=bad), "fsync"),
            (lambda: h.read(buf, p, bad), "validate"),
            (lambda: h.read(buf, p, allow_short=bad), "allow_short"),
            (lambda: nvio.AioHandle(single_submit=bad), "single_submit"),
            (lambda: nvio.AioHandle(overlap_events=bad), "overlap_events"),
            (lambda: nvio.LockedBuffer(16, require_locked=bad), "require_locked"),
        ]:
            with pytest.raises(TypeError, match=name):
                call()
        assert h.pending() == 0          # "False" never ran asynchronously


def test_flags_take_bools_and_01(tmp_path):
    p = str(tmp_path / "f")
    write_file(p, b"x" * 16)
    buf = bytearray(16)
    with nvio.AioHandle(single_submit=1, overlap_events=0) as h:
        assert h.get_single_submit() is True and h.get_overlap_events() is False
        assert h.pread(buf, p, 0, 1) == 0 and h.wait() == 1
        assert h.pread(buf, p, True, False) == 1


@pytest.mark.parametrize("kw,limit", [
    ({"queue_depth": 4097}, "4096"), ({"queue_depth": 0}, "4096"),
    ({"intra_op_parallelism": 100000}, "256"), ({"block_size": 0}, "block_size"),
    ({"staging_bytes": -1}, "staging_bytes")])
def test_limits_are_named(kw, limit):
    with pytest.raises(ValueError, match=limit):
        nvio.AioHandle(**kw)
