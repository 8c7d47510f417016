"""nvio.save writing windows while it still pickles (issue 33).

A checkpoint of many small host storages is laid out with its tensor
records first, as the pickler meets the storages, and its first windows
go to the file before the pickle is done (``_base.plan.ImageStream``).
These tests shrink the windows and the grow step so that a state of a few
hundred small tensors streams, and check on every engine that the file is
the checkpoint (torch.load, zipfile's CRC check, nvio.load with verify),
that windows really were written before the last object was pickled, and
that every failure on the way (an unpicklable object, a storage the stream
cannot copy, a full disk, Ctrl-C) leaves the old checkpoint and no
temporary behind.
"""
import errno
import os
import zipfile

import pytest

import nvio
from nvio import _nvio
from nvio._base import plan as _plan
from nvio._base import torchzip as _zip

torch = pytest.importorskip("torch")

WINDOW = 64 << 10


def many(n, seed, lo=200, hi=3000):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(lo, hi, (n,), generator=g).tolist()
    return {"t.%d" % i: torch.randn(k, generator=g) for i, k in enumerate(sizes)}


@pytest.fixture
def small_windows(monkeypatch):
    """Windows of 64 KiB, grow every 64 KiB, allocation in 256 KiB steps,
    and the windows each stream writes recorded: (stream, [(w0, pickled so
    far)])."""
    monkeypatch.setattr(_plan, "PACK_WINDOW", WINDOW)
    monkeypatch.setattr(_plan, "GROW_BYTES", WINDOW)
    monkeypatch.setattr(_plan.ImageStream, "ALLOC_STEP", 256 << 10)
    log = []
    real_pump = _plan.ImageStream._pump

    def pump(self, wait):
        k0 = self.next
        real_pump(self, wait)
        if self.next != k0:
            log.append((k0, self.next, Marker.pickled))
    monkeypatch.setattr(_plan.ImageStream, "_pump", pump)
    Marker.pickled = False
    return log


class Marker:
    """Pickled last: notes that the pickler reached the end of the state."""

    pickled = False

    def __reduce__(self):
        Marker.pickled = True
        return (Marker, ())


def check_file(path, sd, weights_only=True):
    """The file is a zip whose CRCs hold and a checkpoint of sd's tensors for
    torch.load (also mmap'ed) and nvio.load(verify=True); its record names."""
    with zipfile.ZipFile(path) as z:          # every record's CRC-32 and size
        assert z.testzip() is None
        names = [i.filename for i in z.infolist()]
    wo = weights_only
    for got in (torch.load(path, weights_only=wo), nvio.load(path, weights_only=wo, verify=True),
                torch.load(path, mmap=True, weights_only=wo)):
        assert set(got) - {"zz_marker"} == set(sd)
        for k, v in sd.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(got[k], v), k
    return names


@pytest.mark.parametrize("spare", [False, True], ids=["new", "spare"])
def test_streamed_save_is_the_checkpoint(handle, tmp_path, small_windows, spare):
    """Windows go to the file before the last object is pickled; the file
    holds the tensor records first, then the pickle, and reads back equal
    with torch.load, zipfile and nvio.load(verify=True)."""
    sd = many(400, seed=1)
    sd["empty"] = torch.empty(0)
    sd["view"] = sd["t.7"][3:]             # shares t.7's storage
    sd["zz_marker"] = Marker()
    p = tmp_path / "ck.pt"
    for round_ in range(2 if spare else 1):
        del small_windows[:]
        Marker.pickled = False
        nvio.save(sd, p, handle=handle, spare=spare)
        early = [w for w in small_windows if not w[2]]
        assert early, "no window was written before the pickle ended"
        assert small_windows[0][0] == 0
        ends = [w[1] for w in small_windows]
        assert ends == sorted(ends) and ends[-1] == os.path.getsize(p)
        got = torch.load(p, weights_only=False)
        assert isinstance(got["zz_marker"], Marker)
        names = check_file(p, {k: v for k, v in sd.items() if k != "zz_marker"},
                           weights_only=False)
        data = [n for n in names if "/data/" in n]
        assert names[:len(data)] == data          # the tensor records come first
        assert names[len(data)].endswith("/data.pkl")
        assert torch.equal(got["view"], sd["t.7"][3:])
        assert got["view"].untyped_storage().data_ptr() == got["t.7"].untyped_storage().data_ptr()


def test_streamed_unstreamed_and_async_files_hold_the_same_records(tmp_path, small_windows,
                                                                   monkeypatch):
    """The same state streamed, not streamed (the same layout, written once
    planned) and by async_save (data.pkl first, as torch.save has it): the
    same records with the same bytes and CRCs; only their order differs."""
    sd = many(300, seed=2)
    paths = [tmp_path / d / "ck.pt" for d in ("a", "b", "c")]
    for p in paths:
        p.parent.mkdir()
    nvio.save(sd, paths[0])
    assert small_windows
    monkeypatch.setattr(_plan, "GROW_BYTES", 1 << 40)     # never grows: not streamed
    del small_windows[:]
    nvio.save(sd, paths[1])
    nvio.async_save(sd, paths[2]).result()
    assert not small_windows
    recs, order = [], []
    for p in paths:
        with zipfile.ZipFile(p) as z:
            recs.append({i.filename: (i.CRC, z.read(i)) for i in z.infolist()
                         if not i.filename.endswith("serialization_id")})
            order.append([i.filename for i in z.infolist()])
    assert recs[0] == recs[1] == recs[2]
    assert order[0] == order[1] != order[2]
    assert order[2][0] == "ck/data.pkl" and order[0][0] == "ck/data/0"


@pytest.mark.parametrize("fast", [True, False], ids=["reduced-in-c", "torchs-reduction"])
def test_streams_with_every_reduction(tmp_path, small_windows, monkeypatch, fast):
    """The pickler calls back whether tensors are reduced in C or by torch's
    own reduction (storages then enter through _StorageIds in Python)."""
    if not fast:
        monkeypatch.setattr(_plan, "FAST_REDUCE", False)
    sd = many(300, seed=13)
    p = tmp_path / "ck.pt"
    nvio.save(sd, p)
    assert small_windows
    check_file(p, sd)


def test_no_stream_for_large_tensors(tmp_path, small_windows):
    """A state of few large tensors never streams (the direct writer moves
    them straight from their memory), and is still the checkpoint."""
    g = torch.Generator().manual_seed(3)
    sd = {"w%d" % i: torch.randn(40000, generator=g) for i in range(8)}
    p = tmp_path / "ck.pt"
    nvio.save(sd, p)
    assert not small_windows
    check_file(p, sd)


def test_restart_writes_the_checkpoint_the_plain_way(tmp_path, small_windows, monkeypatch):
    """A storage the stream cannot copy, met after it started (simulated:
    the check raises Restart at its fifth call), makes the save start
    over without streaming: the file is the checkpoint, no temporary left."""
    calls = [0]
    real = _plan.ImageStream._check

    def check(self, plan):
        real(self, plan)
        calls[0] += 1
        if calls[0] == 5 and self.started:
            raise _plan.Restart()
    monkeypatch.setattr(_plan.ImageStream, "_check", check)
    sd = many(400, seed=4)
    p = tmp_path / "ck.pt"
    nvio.save(sd, p)
    assert calls[0] >= 5
    assert small_windows                      # the first attempt had streamed
    check_file(p, sd)
    assert sorted(os.listdir(tmp_path)) == ["ck.pt"]


def test_meta_storage_after_the_stream_started(tmp_path, small_windows):
    """A meta storage after the first windows: the save restarts and fails
    as an unstreamed one does, naming the storage; the old checkpoint stays
    and no temporary is left."""
    p = tmp_path / "ck.pt"
    nvio.save({"old": torch.ones(10)}, p)
    before = p.read_bytes()
    sd = many(400, seed=5)
    sd["zz_meta"] = torch.UntypedStorage(100, device="meta")
    del small_windows[:]
    with pytest.raises(nvio.checkpoint.CheckpointError, match="meta device"):
        nvio.save(sd, p)
    assert small_windows
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["ck.pt"]


class Bad:
    def __reduce__(self):
        raise TypeError("cannot pickle a Bad")


class Interrupt:
    def __reduce__(self):
        raise KeyboardInterrupt


@pytest.mark.parametrize("last", [Bad, Interrupt], ids=["unpicklable", "ctrl-c"])
def test_error_after_windows_leaves_the_old_checkpoint(handle, tmp_path, small_windows,
                                                       last):
    """An object that cannot be pickled, or Ctrl-C, once windows are in
    flight: the error comes out, the old checkpoint stays, no temporary
    (nor spare) is left, and the writes in flight ended first."""
    p = tmp_path / "ck.pt"
    nvio.save({"old": torch.ones(10)}, p, handle=handle)
    before = p.read_bytes()
    sd = many(400, seed=6)
    sd["zz_last"] = last()
    del small_windows[:]
    with pytest.raises(nvio.checkpoint.CheckpointError if last is Bad else KeyboardInterrupt):
        nvio.save(sd, p, handle=handle)
    assert small_windows
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["ck.pt"]
    assert handle.pending() == 0
    check_file(p, {"old": torch.ones(10)})


def test_full_disk_while_streaming(tmpfs, small_windows):
    """ENOSPC while the stream allocates or writes: the error names it, the
    old checkpoint stays, nothing else is left on the file system."""
    mnt = tmpfs("small", "size=3m")
    p = mnt / "ck.pt"
    nvio.save({"old": torch.ones(1000)}, p)
    before = p.read_bytes()
    with pytest.raises(OSError) as ei:
        nvio.save(many(1200, seed=7, lo=500, hi=1500), p)
    assert ei.value.errno == errno.ENOSPC
    assert small_windows
    assert p.read_bytes() == before
    assert sorted(os.listdir(mnt)) == ["ck.pt"]


def test_tensor_reducer_grow_is_called_every_grow_bytes():
    """The pickler's grow callback comes each time the new storages reach
    grow_bytes (each with grow_extra), right after the storage is entered;
    an error it raises is the pickle's."""
    import io
    seen = []
    st = {}
    sd = {"t%d" % i: torch.ones(250) for i in range(10)}     # 1000 bytes each
    pk = _plan._Pickler(io.BytesIO(), 2, st, grow=lambda: seen.append(len(st)),
                        grow_bytes=2500, grow_extra=250)
    pk.dump(sd)
    assert seen == [2, 4, 6, 8, 10]

    def boom():
        raise ValueError("from grow")
    pk = _plan._Pickler(io.BytesIO(), 2, {}, grow=boom, grow_bytes=1)
    with pytest.raises(ValueError, match="from grow"):
        pk.dump(sd)


@pytest.mark.parametrize("exc", [OSError(errno.EIO, "injected"), RuntimeError("injected")],
                         ids=["oserror", "runtimeerror"])
def test_plan_reports_the_grow_callbacks_own_error(tmp_path, monkeypatch, exc):
    """An error of the grow callback (an OSError of a write, a RuntimeError
    of the image) comes out of Plan as itself, not as 'cannot pickle the
    object'."""
    monkeypatch.setattr(_plan, "GROW_BYTES", 1)

    def grow(plan):
        raise exc
    with pytest.raises(type(exc), match="injected") as ei:
        _plan.Plan(many(20, seed=8), tmp_path / "x.pt", grow=grow)
    assert ei.value is exc


def image_bytes(img, size, window):
    out = bytearray()
    buf = _nvio.LockedBuffer(window)
    for w0 in range(0, size, window):
        w1 = min(w0 + window, size)
        img.copy(buf.address, w0, w1, 0)
        img.fill(buf.address, w0, w1)
        out += memoryview(buf)[:w1 - w0]
    return bytes(out)


def test_zip_image_extend_gives_the_whole_images_bytes(tmp_path):
    """An image extended record by record, windows filled in between as far
    as it is laid out, has the bytes of the image made whole."""
    sd = many(50, seed=9)
    plan = _plan.Plan(sd, tmp_path / "x.pt", grow=lambda plan: None)
    recs = plan.layout.records
    srcs = [s.data_ptr() for _, s in plan.data]
    whole = image_bytes(_nvio.ZipImage([(0, recs, plan.meta, srcs, plan.dir_offset,
                                         plan.size)], plan.size, 1, _zip.ZIP64_LIMIT),
                        plan.size, 8192)
    img = _nvio.ZipImage([], 0, 1, _zip.ZIP64_LIMIT)
    buf = _nvio.LockedBuffer(8192)
    out, w0, nd = bytearray(), 0, len(plan.data)
    for i in range(0, nd, 7):
        j = min(i + 7, nd)
        img.extend(0, recs[i:j], plan.meta, srcs[i:j])
        end = recs[j - 1]
        end = end.end + end.descriptor_size
        while w0 + 8192 <= end:
            img.copy(buf.address, w0, w0 + 8192, 0)
            img.fill(buf.address, w0, w0 + 8192)
            out += memoryview(buf)[:8192]
            w0 += 8192
    img.extend(0, recs[nd:], plan.meta, [], plan.dir_offset, plan.size)
    while w0 < plan.size:
        w1 = min(w0 + 8192, plan.size)
        img.copy(buf.address, w0, w1, 0)
        img.fill(buf.address, w0, w1)
        out += memoryview(buf)[:w1 - w0]
        w0 = w1
    assert bytes(out) == whole
    with pytest.raises(ValueError, match="past|window"):
        img.copy(buf.address, plan.size, plan.size + 1, 0)


def test_zip_image_extend_refusals(tmp_path):
    """extend: dir_offset without size, another archive's base, a record
    overlapping the image, and anything after a failed extend are refused."""
    plan = _plan.Plan(many(10, seed=10), tmp_path / "x.pt", grow=lambda plan: None)
    recs = plan.layout.records
    srcs = [s.data_ptr() for _, s in plan.data]
    img = _nvio.ZipImage([], 0, 1, _zip.ZIP64_LIMIT)
    with pytest.raises(ValueError, match="come together"):
        img.extend(0, recs[:2], plan.meta, srcs[:2], 100)
    img.extend(0, recs[:2], plan.meta, srcs[:2])
    with pytest.raises(ValueError, match="open archive starts at 0"):
        img.extend(4096, recs[2:3], plan.meta, srcs[2:3])
    with pytest.raises(ValueError, match="overlaps"):
        img.extend(0, recs[:1], plan.meta, srcs[:1])      # a record laid out twice
    buf = _nvio.LockedBuffer(4096)
    with pytest.raises(RuntimeError, match="incomplete"):
        img.copy(buf.address, 0, 4096, 0)
    with pytest.raises(RuntimeError, match="incomplete"):
        img.extend(0, recs[2:3], plan.meta, srcs[2:3])


def test_space_guessed_from_the_file_it_replaces(tmpfs, small_windows):
    """The stream allocates, before its first write, what the file it
    replaces held: more than the new checkpoint needs is cut off at the
    end (the file is exactly the checkpoint); a guess the disk cannot hold
    falls back to what is laid out, and the save succeeds."""
    mnt = tmpfs("guess", "size=16m")
    p = mnt / "ck.pt"
    sd = many(600, seed=11, lo=500, hi=1500)          # a file of ~3.9 MB
    p.write_bytes(b"x" * (6 << 20))                    # larger: the guess is too big
    allocs = []
    real = _plan.ImageStream._allocate

    def allocate(self, close):
        a = self.allocated
        real(self, close)
        if self.allocated != a:
            allocs.append(self.allocated)
    import pytest as _pt
    mp = _pt.MonkeyPatch()
    mp.setattr(_plan.ImageStream, "_allocate", allocate)
    try:
        nvio.save(sd, p)
        assert allocs[0] == 6 << 20                    # the guess, before any write
        size = os.path.getsize(p)
        assert size < 6 << 20 and allocs[-1] == size   # cut to the checkpoint
        check_file(p, sd)
        # a replaced file of 9 MB on 16 MB: the guess does not fit beside it
        # (the old file holds its blocks until the commit), the save still does
        p.write_bytes(b"y" * (9 << 20))
        del allocs[:]
        nvio.save(sd, p)
        assert allocs and allocs[0] < 9 << 20
        check_file(p, sd)
        assert sorted(os.listdir(mnt)) == ["ck.pt"]
    finally:
        mp.undo()


def test_spare_blocks_are_allocated_before_the_first_write(tmp_path, small_windows,
                                                          monkeypatch):
    """A spare save allocates the spare's old blocks (all of them, at once,
    before its first window) so that libnvio knows no write extends the
    file: else it would allocate before each window, waiting each time for
    the writes in flight."""
    sd = many(500, seed=12)
    p = tmp_path / "ck.pt"
    nvio.save(sd, p, spare=True)
    nvio.save(sd, p, spare=True)                  # the spare is there now
    spare = tmp_path / ".ck.pt.nvio-spare"
    old = os.path.getsize(spare)
    seen = []
    real_pump = _plan.ImageStream._pump

    def pump(self, wait):
        seen.append(self.f.size)      # what libnvio knows the file to hold
        real_pump(self, wait)
    monkeypatch.setattr(_plan.ImageStream, "_pump", pump)
    nvio.save(sd, p, spare=True)
    assert seen and all(n >= old for n in seen)
    check_file(p, sd)
