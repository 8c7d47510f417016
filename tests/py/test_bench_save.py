"""bench/save_bench.py's breakdown machinery (issue 33): the timers it puts
around nvio's internals count a save's steps, leave its file intact, and
come off again; strace's log is split into fsync, link/rename and the
directory's fsync. (The benchmark itself needs root and minutes: not here.)"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
import nvio  # noqa: E402
from nvio import _futures, handles  # noqa: E402

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")


@pytest.fixture(scope="module")
def sb():
    sys.path.insert(0, BENCH)
    try:
        import save_bench
    finally:
        sys.path.remove(BENCH)
    return save_bench


def _state(packed):
    g = torch.Generator().manual_seed(7)
    if packed:      # >= 64 small host storages: the windowed path
        return {"t.%d" % i: torch.rand(1000 + i, generator=g) for i in range(80)}
    return {"a": torch.rand(300000, generator=g), "b": torch.rand(5, generator=g).double(),
            "n": torch.arange(7)}


def _patched():
    return {"open": handles.AioHandle.__dict__.get("open"),
            "file_class": handles.AioHandle.__dict__.get("_file_class"),
            "result": _futures.NvioFuture.__dict__.get("result")}


@pytest.mark.parametrize("packed", [False, True], ids=["direct", "packed"])
def test_hooks_count_a_save_and_come_off(sb, handle, tmp_path, packed):
    before = _patched()
    sd = _state(packed)
    p = tmp_path / "x.pt"
    hooks = sb.Hooks()
    with hooks.on():
        assert handles.AioHandle.__dict__.get("open") is not None
        nvio.save(sd, p, handle=handle)
    assert _patched() == before
    got = torch.load(p)
    assert got.keys() == sd.keys()
    for k in sd:
        assert got[k].dtype == sd[k].dtype
        assert torch.equal(got[k], sd[k])
    # one temporary opened and committed; pickled and planned once
    assert hooks.n["open"] == 1 and hooks.n["commit"] == 1
    assert hooks.n["pickling"] == 1 and hooks.n["planning"] == 1
    assert all(v >= 0 for v in hooks.t.values())
    # a save with the timers off leaves the counts alone
    n = dict(hooks.n)
    nvio.save(sd, p, handle=handle)
    assert dict(hooks.n) == n


def test_hooks_time_the_dcp_writer_and_come_off(sb, tmp_path):
    """The nvio.dcp row: write_data and finish timed once each, a Plan per
    tensor item, the writer's methods restored after; the checkpoint loads."""
    import warnings
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import nvio.dcp as nd
    before = (nd.FileSystemWriter.__dict__["write_data"], nd.FileSystemWriter.__dict__["finish"])
    sd = _state(True)
    hooks = sb.Hooks()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with hooks.on():
            dcp.save(sd, storage_writer=nd.FileSystemWriter(tmp_path), no_dist=True)
        got = {k: torch.zeros_like(v) for k, v in sd.items()}
        dcp.load(got, storage_reader=nd.FileSystemReader(tmp_path), no_dist=True)
    assert (nd.FileSystemWriter.__dict__["write_data"],
            nd.FileSystemWriter.__dict__["finish"]) == before
    assert hooks.n["writer's Python"] >= 1 and hooks.n["DCP metadata"] == 1
    assert hooks.n["planning"] == len(sd)
    assert hooks.t["writer's Python"] > 0 and hooks.t["DCP metadata"] > 0
    assert all(torch.equal(got[k], sd[k]) for k in sd)


def test_hooks_come_off_after_an_error(sb, tmp_path):
    before = _patched()
    with pytest.raises(ZeroDivisionError):
        with sb.Hooks().on():
            1 / 0
    assert _patched() == before


def test_strace_split(sb, tmp_path):
    log = tmp_path / "s.log"
    log.write_text('101 fsync(5) = 0 <0.001500>\n'
                   '102 fsync(9 <unfinished ...>\n'
                   '101 linkat(AT_FDCWD, "/proc/self/fd/5", AT_FDCWD, "/d/x.pt", '
                   'AT_SYMLINK_FOLLOW) = 0 <0.000250>\n'
                   '101 renameat2(AT_FDCWD, "/d/.t", AT_FDCWD, "/d/x.pt", RENAME_EXCHANGE)'
                   ' = 0 <0.000125>\n'
                   '102 <... fsync resumed>) = 0 <0.004000>\n'
                   '101 +++ exited with 0 +++\n')
    got = sb.strace_split(str(log))
    assert got == pytest.approx({"fsync": 0.0015, "link/rename": 0.000375,
                                 "fsync dir": 0.004})
