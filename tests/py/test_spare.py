"""Saves with spare=True (libnvio's FILE_SPARE): the new version is written
into the blocks of the version before the last, kept beside the file as
the hidden spare ``.NAME.nvio-spare`` and swapped with it at commit.

Checked on every engine, direct I/O on and off: nvio.save round trips over
saves that grow and shrink (torch.load equal every time), the inodes show
the spare was used (the spare's becomes the file's, the old file's the
spare), async_save the same, safetensors files read back by the safetensors
library and equal to its own bytes, flags and arguments refused where they
do not apply, and the cleaning of spares. The SIGKILL loop with spare=True
is in test_checkpoint_faults.py.
"""
import os
import zipfile

import pytest

import nvio
from nvio import _nvio
from nvio_testutil import same

torch = pytest.importorskip("torch")


def state(i, n):
    g = torch.Generator().manual_seed(i)
    return {"i": i, "w": torch.randn(n, generator=g),
            "b": torch.arange(i + 3, dtype=torch.int64),
            "h": torch.randn(7, 5, generator=g).to(torch.bfloat16)}


def spare_of(p):
    return os.path.join(os.path.dirname(p), "." + os.path.basename(p) + ".nvio-spare")


def ino(p):
    return os.lstat(p).st_ino


# sizes of the four saves: grow past the spare, shrink well below it
SIZES = [300_000, 700_001, 5_000, 400_000]


def test_save_spare_round_trips(handle, tmp_path):
    p = str(tmp_path / "ck.pt")
    sp = spare_of(p)
    inos = []
    for i, n in enumerate(SIZES):
        before = ino(p) if os.path.exists(p) else None
        spare_before = ino(sp) if os.path.exists(sp) else None
        st = state(i, n)
        nvio.save(st, p, handle=handle, spare=True)
        same(torch.load(p, weights_only=True), st)
        same(nvio.load(p, handle=handle), st)
        assert sorted(os.listdir(tmp_path)) == (["ck.pt"] if i == 0 else [".ck.pt.nvio-spare",
                                                                          "ck.pt"])
        if i >= 1:
            assert ino(sp) == before            # the old version is the spare now
        if i >= 2:
            assert ino(p) == spare_before       # written into the spare's blocks
        inos.append(ino(p))
    assert inos[2] == inos[0] and inos[3] == inos[1]


def test_save_spare_exact_size_and_valid_zip(tmp_path):
    """The size of a save without spare (no stale bytes of the larger old
    version past the end of the smaller new one), and a zip whose every
    record's CRC-32 checks (torch.save's records differ only in the random
    serialization id)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = str(tmp_path / "a" / "ck.pt"), str(tmp_path / "b" / "ck.pt")
    for i, n in enumerate(SIZES):
        nvio.save(state(i, n), a, spare=True)
        nvio.save(state(i, n), b)
        assert os.path.getsize(a) == os.path.getsize(b), i
        with zipfile.ZipFile(a) as z:
            assert z.testzip() is None, i


def test_async_save_spare(tmp_path):
    p = str(tmp_path / "ck.pt")
    futs = []
    states = [state(i, n) for i, n in enumerate(SIZES)]
    for st in states[:3]:
        futs.append(nvio.async_save(st, p, spare=True))
        futs[-1].result()
        same(torch.load(p, weights_only=True), st)
    t = ino(p)
    s = ino(spare_of(p))
    nvio.async_save(states[3], p, spare=True, durable=False).result()
    same(torch.load(p, weights_only=True), states[3])
    assert ino(p) == s and ino(spare_of(p)) == t


def test_spare_refused_where_it_does_not_apply(tmp_path):
    p = str(tmp_path / "ck.pt")
    with pytest.raises(ValueError, match="group"):
        nvio.save({"a": torch.ones(3)}, p, spare=True, group=object())
    assert not os.path.exists(p)
    h = nvio.Handle()
    with pytest.raises(ValueError, match="flags"):
        h.open(p, _nvio.FILE_WRITE | _nvio.FILE_CREATE | _nvio.FILE_SPARE)
    with pytest.raises((TypeError, ValueError)):
        nvio.save({"a": torch.ones(3)}, p, spare="yes")
    h.close()


def test_abandoned_spare_save_leaves_the_file(tmp_path):
    """An error inside a spare save: the file keeps its bytes and inode, the
    spare stays (its blocks are what it is kept for), nothing else left."""
    p = str(tmp_path / "ck.pt")
    for i in range(2):
        nvio.save(state(i, 1000), p, spare=True)
    before = open(p, "rb").read()
    t, s = ino(p), ino(spare_of(p))

    class Bad:
        def __reduce__(self):
            raise RuntimeError("cannot pickle this")

    with pytest.raises(Exception):
        nvio.save({"w": torch.ones(100_000), "bad": Bad()}, p, spare=True)
    h = nvio.Handle()
    with pytest.raises(RuntimeError, match="boom"):
        with h.open(p, _nvio.FILE_ATOMIC | _nvio.FILE_SPARE) as f:
            f.pwrite(b"x" * 5000, 0)
            raise RuntimeError("boom")
    h.close()
    assert open(p, "rb").read() == before
    assert ino(p) == t and ino(spare_of(p)) == s
    assert sorted(os.listdir(tmp_path)) == [".ck.pt.nvio-spare", "ck.pt"]


def test_safetensors_save_file_spare(handle, tmp_path):
    st = pytest.importorskip("safetensors.torch")
    from nvio import safetensors as nst
    p = str(tmp_path / "m.safetensors")
    for i, n in enumerate(SIZES):
        g = torch.Generator().manual_seed(i)
        ts = {"w%d" % k: torch.randn(n // (k + 1), generator=g) for k in range(3)}
        ts["e"] = torch.zeros(0, dtype=torch.int8)
        meta = {"step": str(i)}
        nst.save_file(ts, p, metadata=meta, handle=handle, spare=True)
        got = st.load_file(p)
        assert got.keys() == ts.keys()
        for k in ts:
            assert torch.equal(got[k], ts[k]), k
        with open(p, "rb") as f:
            assert f.read() == st.save(ts, metadata=meta), i
    assert os.path.exists(spare_of(p))


def test_clean_spares(tmp_path):
    p = str(tmp_path / "ck.pt")
    for i in range(2):
        nvio.save(state(i, 1000), p, spare=True)
    # the sweep of dead writers' temporaries never takes a spare
    n, found = _nvio.clean_temporaries(str(tmp_path))
    assert n == 0 and found == []
    n, found = _nvio.clean_temporaries(str(tmp_path), spares=True)
    assert n == 0 and [(x, r) for x, r, _ in found] == [(".ck.pt.nvio-spare", 0)]
    os.unlink(p)
    n, found = _nvio.clean_temporaries(str(tmp_path), spares=True, dry_run=True)
    assert n == 1 and os.listdir(tmp_path) == [".ck.pt.nvio-spare"]
    n, _ = _nvio.clean_temporaries(str(tmp_path), spares=True)
    assert n == 1 and os.listdir(tmp_path) == []
    for i in range(2):
        nvio.save(state(i, 1000), p, spare=True)
    n, _ = _nvio.clean_temporaries(str(tmp_path), spares="all")
    assert n == 1 and os.listdir(tmp_path) == ["ck.pt"]
    with pytest.raises(ValueError):
        _nvio.clean_temporaries(str(tmp_path), spares="some")


NVIO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "nvio")


def test_nvio_clean_spares_tool(tmp_path):
    """`nvio clean DIR` keeps spares; `--spares` removes those whose file is
    gone; `--spares=all` every one."""
    import subprocess
    if not os.access(NVIO, os.X_OK):
        pytest.skip("the nvio tool is not built (make)")
    a, b = str(tmp_path / "a.pt"), str(tmp_path / "b.pt")
    for p in (a, b):
        for i in range(2):
            nvio.save(state(i, 1000), p, spare=True)
    os.unlink(a)

    def clean(*args):
        r = subprocess.run([NVIO, "clean", *args, str(tmp_path)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    clean()
    assert sorted(os.listdir(tmp_path)) == [".a.pt.nvio-spare", ".b.pt.nvio-spare", "b.pt"]
    out = clean("--spares")
    assert "removed      .a.pt.nvio-spare" in out and "kept         .b.pt.nvio-spare" in out
    assert sorted(os.listdir(tmp_path)) == [".b.pt.nvio-spare", "b.pt"]
    clean("--spares=all")
    assert os.listdir(tmp_path) == ["b.pt"]
    same(torch.load(b, weights_only=True), state(1, 1000))


def _dcp_state(i, packed):
    if packed:      # many small tensors: the rank file streams through windows
        g = torch.Generator().manual_seed(i)
        n = 120 - 40 * (i % 2)              # files that shrink and grow by turns
        return {"t%d" % k: torch.randn(300 + 11 * k, generator=g) for k in range(n)} | \
            {"step": i}
    return {"w": torch.randn(50_000 + 1000 * (i % 2)), "b": torch.arange(i + 10), "step": i}


@pytest.mark.parametrize("packed", [False, True], ids=["two", "packed"])
@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
def test_dcp_writer_spare_rotation(tmp_path, direct, packed):
    """nvio.dcp.FileSystemWriter(spare=True) saving again and again into one
    directory: DCP's own reader reads every checkpoint; from the third save
    on each data file is the spare its name's last use left (the inode
    shows it), and the directory holds .metadata, the data file and one
    spare, never more. Packed (a rank file of many small tensors, streamed
    through windows into a spare larger or smaller than it): each data
    file ends where its last item does."""
    import warnings
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import nvio.dcp as nd
    if direct and not nvio.probe(str(tmp_path))["direct_ok"]:
        pytest.skip("O_DIRECT not supported here")
    h = nvio.AioHandle(direct=direct)
    d = tmp_path / "ck"
    spares = {}
    for i in range(5):
        sd = _dcp_state(i, packed)
        before = {n: ino(str(d / n)) for n in os.listdir(d)} if d.exists() else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(sd, storage_writer=nd.FileSystemWriter(d, spare=True, handle=h),
                     no_dist=True)
            got = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else -1
                   for k, v in sd.items()}
            dcp.load(got, storage_reader=dcp.FileSystemReader(d), no_dist=True)
        same(got, sd)
        names = sorted(os.listdir(d))
        data = [n for n in names if n.endswith(".distcp")]
        assert len(data) == 1, names
        md = dcp.FileSystemReader(d).read_metadata()
        assert os.path.getsize(d / data[0]) == max(
            s.offset + s.length for s in md.storage_data.values())
        assert data[0] == ("__0_0.distcp" if i % 2 == 0 else "__0_0.b.distcp"), names
        other = "__0_0.b.distcp" if i % 2 == 0 else "__0_0.distcp"
        assert names == sorted([".metadata", data[0]] +
                               ([".%s.nvio-spare" % other] if i >= 1 else []))
        if i >= 2:
            assert ino(str(d / data[0])) == spares[data[0]]    # the spare's blocks
        if i >= 1:
            assert ino(str(d / (".%s.nvio-spare" % other))) == before[other]
            spares[other] = before[other]
    h.close()


@pytest.mark.parametrize("engine", ["io_uring", "libaio", "psync"])
def test_spare_moved_or_removed_during_the_save(tmp_path, engine):
    """Another program moves the spare a save is writing into: the save
    still commits (its file gets a name of its own, renamed over the
    target: no spare is kept), the target holds the new bytes and the moved
    name is left where it was put. Another program
    removes it: the data has no name left, so the commit fails with ENOENT
    saying the spare was removed by another program, naming the target,
    and the target keeps its old bytes and inode; nothing else is left."""
    import errno
    p = str(tmp_path / "ck.pt")
    h = nvio.Handle(engine=engine)
    try:
        for what in ("moved", "removed"):
            for i in range(2):      # a checkpoint and its spare
                nvio.save(state(i, 1000), p, spare=True)
            before, t = open(p, "rb").read(), ino(p)
            new = os.urandom(12345)
            f = h.open(p, _nvio.FILE_ATOMIC | _nvio.FILE_SPARE)
            try:
                f.pwrite(new, 0)
                if what == "moved":
                    os.rename(spare_of(p), str(tmp_path / "elsewhere"))
                    f.commit()
                else:
                    os.unlink(spare_of(p))
                    with pytest.raises(OSError) as ei:
                        f.commit()
            finally:
                f.close()
            if what == "moved":
                assert open(p, "rb").read() == new
                # a plain rename: the old version is not kept as a spare
                assert sorted(os.listdir(tmp_path)) == ["ck.pt", "elsewhere"]
                os.unlink(str(tmp_path / "elsewhere"))
            else:
                assert ei.value.errno == errno.ENOENT
                assert "spare was removed by another program" in str(ei.value), ei.value
                assert "ck.pt" in str(ei.value)
                assert open(p, "rb").read() == before and ino(p) == t
                assert sorted(os.listdir(tmp_path)) == ["ck.pt"]
    finally:
        h.close()
