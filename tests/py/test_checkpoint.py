"""nvio.save / nvio.load / nvio.async_save: torch checkpoints.

Every result is compared element by element with what torch.save/torch.load
give for the same object; every file nvio writes is also read by plain
torch.load (weights_only=True) and checked by Python's zipfile (CRC-32 of
every record). I/O runs on every engine, direct I/O on and off.
"""
import collections
import errno
import os
import pickle
import subprocess
import sys
import zipfile

import pytest

import nvio
import nvio_testutil
from nvio._base import torchzip as _zip

torch = pytest.importorskip("torch")


# --- comparing -----------------------------------------------------------------


def same(a, b, path="obj"):
    """a equals b: same structure, same tensors (dtype, shape, strides, bytes)."""
    return nvio_testutil.same(a, b, path, layout=True)      # bitwise: NaNs and -0.0 too


def sharing(obj):
    """Which tensors share a storage: a canonical partition of tensor paths."""
    groups = collections.defaultdict(list)

    def walk(o, p):
        if isinstance(o, torch.Tensor):
            groups[o.untyped_storage().data_ptr()].append(p)
        elif isinstance(o, dict):
            for k, v in o.items():
                walk(v, p + "/" + str(k))
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, p + "/" + str(i))
    walk(obj, "")
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


# --- objects of every kind --------------------------------------------------------


def gen(seed):
    g = torch.Generator().manual_seed(seed)
    return g


def dtypes():
    out = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
           torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
           torch.complex64, torch.complex128]
    for name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
        if hasattr(torch, name):
            out.append(getattr(torch, name))
    return out


def tensor_of(dtype, shape, seed):
    raw = torch.randint(0, 256, (int(torch.tensor(shape).prod().item()) *
                                 torch.empty(0, dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=gen(seed))
    return raw.view(dtype).reshape(shape)


def objects():
    """(name, object) pairs covering what torch.save accepts."""
    base = torch.randn(64, 33, generator=gen(1))
    objs = {
        "every_dtype": {str(d): tensor_of(d, (3, 7), i) for i, d in enumerate(dtypes())},
        "nested": {"a": [torch.arange(5), (torch.ones(2, 2), {"b": torch.zeros(3)})],
                   "n": 3, "s": "text", "f": 1.5, "none": None, "t": (1, 2),
                   "bytes": b"\x00\xff", "big": 1 << 70},
        "views_share": {"base": base, "row": base[3], "col": base[:, 5], "t": base.t(),
                        "slice": base[10:20:3, 1::4]},
        "non_contiguous_alone": {"x": torch.randn(40, 40, generator=gen(2))[::2, 1::3]},
        "empty_and_0dim": {"e": torch.empty(0), "e2": torch.empty(0, 5, dtype=torch.int64),
                           "s": torch.tensor(3.5), "b": torch.tensor(True)},
        "odd_sizes": [torch.randint(0, 255, (n,), dtype=torch.uint8, generator=gen(n))
                      for n in (1, 511, 512, 513, 4095, 4096, 4097, 65537, (1 << 20) + 3)],
        "requires_grad": {"p": torch.nn.Parameter(torch.randn(5, generator=gen(3))),
                          "g": torch.randn(4, generator=gen(4)).requires_grad_()},
        "list_top": [torch.full((3,), float(i)) for i in range(4)],
        "tuple_top": (torch.ones(1), 2),
        "untyped_storage": {"s": torch.arange(10, dtype=torch.int32).untyped_storage()},
        "special_floats": torch.tensor([float("nan"), float("inf"), -0.0, -float("inf")]),
    }
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    objs["module_state"] = model.state_dict()
    objs["optimizer_state"] = opt.state_dict()
    objs["model_and_optim"] = {"model": model.state_dict(), "optim": opt.state_dict(),
                               "step": 7}
    return objs


OBJECTS = objects()


@pytest.fixture(params=sorted(OBJECTS))
def obj_case(request):
    return request.param, OBJECTS[request.param]


# --- round trips ---------------------------------------------------------------


def test_save_round_trip_matches_torch(obj_case, handle, tmp_path):
    name, obj = obj_case
    p = tmp_path / (name + ".pt")
    nvio.save(obj, p, handle=handle)
    ref = tmp_path / "ref.pt"
    torch.save(obj, ref)
    expected = torch.load(ref, weights_only=True)
    # plain torch.load, weights_only, reads nvio's file
    got_torch = torch.load(p, weights_only=True)
    same(expected, got_torch)
    assert sharing(got_torch) == sharing(expected)
    # and so does nvio.load, from both files
    for f in (p, ref):
        got = nvio.load(f, handle=handle, verify=True)
        same(expected, got)
        assert sharing(got) == sharing(expected)
    # every record intact for any zip reader; data on page boundaries
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None
        names = z.namelist()
    assert all(n.startswith(name + "/") for n in names)
    with nvio.AioHandle().open(p) as f:
        ix = nvio.checkpoint._load.open_index(f, str(p))
        for e in ix.entries.values():
            if "/data/" in e.name:
                assert e.data_offset % 4096 == 0, e.name


def test_async_save_round_trip(obj_case, tmp_path):
    name, obj = obj_case
    p = tmp_path / (name + ".pt")
    fut = nvio.async_save(obj, p)
    assert fut.result(60) == os.path.getsize(p)
    same(torch.load(p, weights_only=True), nvio.load(p))
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None


def test_load_into_locked_memory(handle, tmp_path):
    obj = {"w": torch.randn(300, 300), "b": torch.arange(7)}
    p = tmp_path / "pin.pt"
    torch.save(obj, p)
    got = nvio.load(p, pin_memory=True, handle=handle)
    same(obj, got)
    for t in got.values():
        flags = nvio._nvio.mem_query(t.data_ptr(), max(1, t.nbytes))
        assert flags & nvio._nvio.MEM_LOCKED


def test_map_location_forms(tmp_path):
    obj = {"w": torch.randn(10, 10)}
    p = tmp_path / "m.pt"
    nvio.save(obj, p)
    for ml in (None, "cpu", torch.device("cpu"), {"cpu": "cpu"},
               lambda s, loc: s, lambda s, loc: None):
        same(obj, nvio.load(p, map_location=ml))
    same(obj, nvio.load(p, mmap=True))
    for kw in ({"pin_memory": True}, {"verify": True}):     # nothing they could do
        with pytest.raises(ValueError, match="mmap"):
            nvio.load(p, mmap=True, **kw)


def test_nvio_file_equals_torch_save_record_by_record(tmp_path):
    """Same records (names, except the archive's own id), same bytes."""
    obj = OBJECTS["model_and_optim"]
    a, b = tmp_path / "x.pt", tmp_path / "y.pt"
    nvio.save(obj, a)
    torch.save(obj, b)
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ra = {n.split("/", 1)[1]: za.read(n) for n in za.namelist()}
        rb = {n.split("/", 1)[1]: zb.read(n) for n in zb.namelist()}
    assert ra.pop(".storage_alignment") == b"4096"
    assert rb.pop(".storage_alignment") == b"64"
    assert ra.pop(".data/nvio_format") == b"1"
    ra.pop(".data/serialization_id"), rb.pop(".data/serialization_id")
    assert ra == rb


@pytest.mark.parametrize("name", ["state.v1.pt", "a.b.c", "noext", "x..y", "x."])
def test_records_directory_named_as_torch_names_it(tmp_path, name):
    """torch.save names the records' directory after the file name up to
    its last dot; nvio.save does the same."""
    (tmp_path / "n").mkdir(), (tmp_path / "t").mkdir()
    nvio.save({"a": torch.ones(3)}, tmp_path / "n" / name)
    torch.save({"a": torch.ones(3)}, tmp_path / "t" / name)
    with zipfile.ZipFile(tmp_path / "n" / name) as za, \
            zipfile.ZipFile(tmp_path / "t" / name) as zb:
        da = {n.split("/", 1)[0] for n in za.namelist()}
        db = {n.split("/", 1)[0] for n in zb.namelist()}
    assert da == db and len(da) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this process has CUDA")
@pytest.mark.parametrize("where", ["cuda", "cuda:0", {"cpu": "cuda"}])
def test_map_location_cuda_without_cuda_names_the_problem(tmp_path, where):
    p = tmp_path / "c.pt"
    nvio.save({"w": torch.arange(10.0)}, p)
    with pytest.raises(nvio.CheckpointError, match="no usable CUDA") as ei:
        nvio.load(p, map_location=where)
    assert str(p) in str(ei.value)


class Thing:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return type(other) is Thing and other.v == self.v


def test_weights_only_refuses_arbitrary_objects(tmp_path):
    p = tmp_path / "evil.pt"
    obj = {"t": torch.ones(2), "c": Thing(5)}
    nvio.save(obj, p)
    with pytest.raises(pickle.UnpicklingError) as ei:
        nvio.load(p)
    assert str(p) in str(ei.value) and "weights_only" in str(ei.value)
    got = nvio.load(p, weights_only=False)
    same(obj["t"], got["t"])
    assert got["c"] == obj["c"]


def test_legacy_format_file_is_loaded(tmp_path):
    obj = {"a": torch.randn(5), "b": [torch.arange(3)]}
    p = tmp_path / "legacy.pt"
    torch.save(obj, p, _use_new_zipfile_serialization=False)
    same(obj, nvio.load(p))


def test_file_objects_go_to_torch(tmp_path):
    import io
    obj = {"a": torch.randn(5)}
    buf = io.BytesIO()
    nvio.save(obj, buf)
    buf.seek(0)
    same(obj, nvio.load(buf))


def test_zip64_records(tmp_path, monkeypatch):
    """Records and offsets past 4 GiB take zip64 fields: exercised with the
    limit lowered, read back by nvio, torch and zipfile."""
    monkeypatch.setattr(_zip, "ZIP64_LIMIT", 1000)
    obj = {"a": torch.randn(700), "b": torch.arange(5), "c": torch.randn(3000)}
    p = tmp_path / "z64.pt"
    nvio.save(obj, p)
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None
    same(obj, torch.load(p, weights_only=True))
    same(obj, nvio.load(p, verify=True))


# --- crash safety and errors -------------------------------------------------------


def test_error_leaves_old_checkpoint_and_no_temporary(tmp_path):
    p = tmp_path / "ck.pt"
    nvio.save({"old": torch.ones(3)}, p)
    before = p.read_bytes()
    with pytest.raises(nvio.CheckpointError) as ei:
        nvio.save({"t": torch.ones(3), "bad": lambda: 0}, p)
    assert str(p) in str(ei.value) and "pickle" in str(ei.value)
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["ck.pt"]


def test_missing_directory_names_path(tmp_path):
    p = tmp_path / "nope" / "ck.pt"
    with pytest.raises(FileNotFoundError) as ei:
        nvio.save({"a": torch.ones(1)}, p)
    assert str(p) in str(ei.value) or ei.value.filename == str(p)
    with pytest.raises(FileNotFoundError):
        nvio.load(p)


def test_enospc_leaves_old_checkpoint(tmpfs):
    """A full file system (a small tmpfs) fails the save with ENOSPC."""
    mnt = tmpfs("small", "size=2m")
    p = mnt / "ck.pt"
    nvio.save({"old": torch.ones(1000)}, p)
    before = p.read_bytes()
    with pytest.raises(OSError) as ei:
        nvio.save({"new": torch.ones(1 << 20)}, p)     # 4 MiB > 2 MiB
    assert ei.value.errno == errno.ENOSPC
    assert p.read_bytes() == before
    assert os.listdir(mnt) == ["ck.pt"]
    st = os.statvfs(mnt)
    assert st.f_bfree * st.f_frsize > (1 << 20)          # the space came back
    fut = nvio.async_save({"new": torch.ones(1 << 20)}, p)
    with pytest.raises(OSError) as ei:
        fut.result(60)
    assert ei.value.errno == errno.ENOSPC
    assert p.read_bytes() == before
    assert os.listdir(mnt) == ["ck.pt"]


def test_read_only_file_system(tmpfs):
    mnt = tmpfs("ro", "size=1m")
    p = mnt / "ck.pt"
    nvio.save({"old": torch.ones(10)}, p)
    before = p.read_bytes()
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    with pytest.raises(OSError) as ei:
        nvio.save({"new": torch.zeros(10)}, p)
    assert ei.value.errno == errno.EROFS
    assert str(p) in str(ei.value)
    assert p.read_bytes() == before
    same({"old": torch.ones(10)}, nvio.load(p))


def corrupt_cases(good):
    size = len(good)
    yield "truncated_half", good[:size // 2], "truncated"
    yield "truncated_tail", good[:-10], "truncat"
    yield "not_a_zip", b"hello world" * 100, None
    yield "empty", b"", "empty"


def test_truncated_and_corrupt_files_give_clear_errors(tmp_path):
    obj = {"a": torch.randn(5000), "b": torch.randn(100)}
    p = tmp_path / "good.pt"
    nvio.save(obj, p)
    good = p.read_bytes()
    for name, data, word in corrupt_cases(good):
        q = tmp_path / (name + ".pt")
        q.write_bytes(data)
        with pytest.raises(Exception) as ei:
            nvio.load(q)
        assert str(q) in str(ei.value) or "not a zip" in str(ei.value) or \
            isinstance(ei.value, (pickle.UnpicklingError, RuntimeError)), name
        if word:
            assert word in str(ei.value), (name, str(ei.value))
    # a flipped byte in a tensor record: verify=True names the record
    with nvio.AioHandle().open(p) as f:
        ix = nvio.checkpoint._load.open_index(f, str(p))
        e = ix.entries["good/data/0"]
    bad = bytearray(good)
    bad[e.data_offset + 100] ^= 0xFF
    q = tmp_path / "flipped.pt"
    q.write_bytes(bad)
    with pytest.raises(nvio.CheckpointError) as ei:
        nvio.load(q, verify=True)
    assert "good/data/0" in str(ei.value) and "CRC" in str(ei.value)


def pickle_span(path):
    """(offset, length) of the data.pkl record's bytes in the file."""
    with zipfile.ZipFile(path) as z:
        zi = [i for i in z.infolist() if i.filename.endswith("/data.pkl")][0]
    data = open(path, "rb").read()
    nl, xl = int.from_bytes(data[zi.header_offset + 26:zi.header_offset + 28], "little"), \
        int.from_bytes(data[zi.header_offset + 28:zi.header_offset + 30], "little")
    return zi.header_offset + 30 + nl + xl, zi.file_size


@pytest.mark.parametrize("weights_only", [True, False])
def test_tensor_past_its_storage_is_refused(tmp_path, handle, weights_only):
    """A pickle (one corrupt byte) giving a tensor more elements than its
    storage record holds: refused, naming the file and record, as torch.load
    refuses it; never bytes from past the record or uninitialized memory.
    Small and large records (read by the span, and not)."""
    for rows in (30, 3000):
        p = tmp_path / ("ck%d.pt" % rows)
        nvio.save({"a": torch.ones(rows, 100), "b": torch.arange(10)}, p, handle=handle)
        data = bytearray(p.read_bytes())
        off, n = pickle_span(p)
        pk = bytes(data[off:off + n])
        # (rows, 100) as BININT1/BININT2 then BININT1: rows grown 4x
        i = pk.index(b"K\x1eKd") if rows == 30 else pk.index(b"M\xb8\x0bKd")
        if rows == 30:
            data[off + i + 1] = 120
        else:
            data[off + i + 1:off + i + 3] = (12000).to_bytes(2, "little")
        p.write_bytes(data)
        with pytest.raises(Exception):
            torch.load(p, weights_only=weights_only)
        with pytest.raises(nvio.CheckpointError) as ei:
            nvio.load(p, weights_only=weights_only, handle=handle)
        msg = str(ei.value)
        assert str(p) in msg and ("reaches past its storage" in msg or "resize" in msg), msg


@pytest.mark.filterwarnings("ignore::UserWarning")      # torch's, on odd pickle protocols
def test_corrupt_pickle_and_names_give_one_clear_error(tmp_path):
    """Bytes of data.pkl changed one at a time: every failure is a
    CheckpointError (or torch's UnpicklingError for weights_only) naming
    the file, never a bare KeyError, EOFError, AttributeError... A record
    name in the directory that is not UTF-8: the same."""
    p = tmp_path / "good.pt"
    nvio.save({"a": torch.randn(50), "b": [torch.ones(3), {"c": 1.5}]}, p)
    good = p.read_bytes()
    off, n = pickle_span(p)
    q = tmp_path / "bad.pt"
    bare = []
    for i in range(0, n, 3):
        for v in (0x00, 0x80, 0xFF):
            data = bytearray(good)
            data[off + i] = v
            q.write_bytes(data)
            try:
                nvio.load(q)
            except nvio.CheckpointError as e:
                assert str(q) in str(e)
            except pickle.UnpicklingError as e:
                assert str(q) in str(e)
            except Exception as e:     # noqa: BLE001 - what the test is about
                bare.append((i, v, type(e).__name__, str(e)[:80]))
    assert not bare, bare[:5]
    # a directory entry's name made invalid UTF-8
    data = bytearray(good)
    j = good.rindex(b"good/data.pkl")
    data[j] = 0xFF
    q.write_bytes(data)
    with pytest.raises(nvio.CheckpointError) as ei:
        nvio.load(q)
    assert str(q) in str(ei.value) and "UTF-8" in str(ei.value)
    r = subprocess.run([sys.executable, "-m", "nvio.checkpoint", "verify", str(q)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "UTF-8" in r.stdout + r.stderr


def test_file_name_not_utf8(tmp_path):
    """A file name of bytes that are not UTF-8 (torch.save takes it): the
    records are named "archive/..." and the file loads with both."""
    p = os.path.join(os.fsencode(tmp_path), b"ck\xe9.pt")
    sd = {"a": torch.arange(5.0)}
    nvio.save(sd, p)
    same(sd, torch.load(os.fsdecode(p)))      # torch takes str paths only
    same(sd, nvio.load(p))
    with zipfile.ZipFile(os.fsdecode(p)) as z:
        assert "archive/data.pkl" in z.namelist()
    nvio.async_save(sd, os.fsdecode(p)).result()
    same(sd, nvio.load(p))


def test_newer_nvio_format_is_refused(tmp_path):
    p = tmp_path / "new.pt"
    nvio.save({"a": torch.ones(3)}, p)
    data = bytearray(p.read_bytes())
    with nvio.AioHandle().open(p) as f:
        ix = nvio.checkpoint._load.open_index(f, str(p))
        e = ix.entries["new/.data/nvio_format"]
    data[e.data_offset] = ord("9")      # same length, same CRC position
    p.write_bytes(data)
    with pytest.raises(nvio.CheckpointError) as ei:
        nvio.load(p)
    assert "newer nvio" in str(ei.value) and str(p) in str(ei.value)


def test_durable_false_still_replaces_atomically(tmp_path):
    p = tmp_path / "nd.pt"
    nvio.save({"a": torch.ones(3)}, p)
    nvio.save({"a": torch.zeros(4)}, p, durable=False)
    same({"a": torch.zeros(4)}, nvio.load(p))
    with pytest.raises(TypeError):
        nvio.save({"a": torch.ones(1)}, p, durable="no")


# --- async -----------------------------------------------------------------------


def test_async_save_snapshots_at_call_time(tmp_path):
    w = torch.randn(512, 512)
    state = {"w": w, "step": torch.tensor(1)}
    futs, snaps = [], []
    for i in range(3):
        snaps.append({k: v.clone() for k, v in state.items()})
        futs.append(nvio.async_save(state, tmp_path / ("s%d.pt" % i)))
        w.add_(1.0)                      # training goes on at once
        state["step"].add_(1)
    for i, f in enumerate(futs):
        f.result(60)
        got = nvio.load(tmp_path / ("s%d.pt" % i))
        same(snaps[i], got)
    assert not torch.equal(snaps[0]["w"], snaps[1]["w"])


def test_async_saves_are_written_in_order_to_one_path(tmp_path):
    p = tmp_path / "one.pt"
    c = nvio.AsyncCheckpointer()
    futs = [c.save({"i": torch.tensor(i), "x": torch.full((1000,), i)}, p) for i in range(5)]
    for f in futs:
        f.result(60)
    assert c.pending == 0
    same({"i": torch.tensor(4), "x": torch.full((1000,), 4)}, nvio.load(p))
    c.close()


def test_async_pool_is_reused_and_bounded(tmp_path):
    c = nvio.AsyncCheckpointer(pool_bytes=8 << 20)
    state = {"w": torch.randn(256, 1024)}        # 1 MiB
    for i in range(4):
        c.save(state, tmp_path / ("p%d.pt" % i)).result(60)
    assert c._held <= 8 << 20
    with pytest.raises(ValueError) as ei:
        c.save({"w": torch.randn(3 << 20)}, tmp_path / "huge.pt")   # 12 MiB
    assert "pool" in str(ei.value) and str(8 << 20) in str(ei.value)
    assert not (tmp_path / "huge.pt").exists()
    c.close()
    with pytest.raises(ValueError):
        c.save(state, tmp_path / "closed.pt")


def test_async_save_lets_the_callers_tensors_go(tmp_path):
    """Once async_save returns, the snapshot is all the write needs: the
    caller's tensors are freed when the caller drops them, not when the
    next save comes."""
    import weakref
    c = nvio.AsyncCheckpointer()
    t = torch.randn(1 << 20)
    ref = weakref.ref(t.untyped_storage())
    s = t.untyped_storage()
    fut = c.save({"t": t}, tmp_path / "a.pt")
    del t, s
    fut.result(60)
    assert ref() is None
    c.close()


def test_async_done_callback_may_queue_the_next_save(tmp_path):
    """A done-callback (run on the writer thread) that queues the next save
    on a pool of one snapshot gets the buffer its save just released; one
    that calls wait() is told it cannot, instead of hanging the writer."""
    import threading
    c = nvio.AsyncCheckpointer(pool_bytes=4 << 20)
    state = {"w": torch.randn(512 << 10)}       # 2 MiB: one snapshot at a time
    second, told = [], []
    done = threading.Event()

    def chain(f):
        second.append(c.save(state, tmp_path / "b.pt"))
        try:
            c.wait()
        except RuntimeError as e:
            told.append(str(e))
        done.set()
    c.save(state, tmp_path / "a.pt").add_done_callback(chain)
    assert done.wait(30)
    assert second[0].result(30) > 0 and told and "callback" in told[0]
    assert c.wait(30)
    assert torch.equal(nvio.load(tmp_path / "b.pt")["w"], state["w"])
    c.close()


def test_async_save_path_is_resolved_at_the_call(tmp_path, monkeypatch):
    """A relative path names the file in the directory current at the
    call, whatever the directory is when the write starts."""
    import threading
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    c = nvio.AsyncCheckpointer()
    gate = threading.Event()
    real = c._write
    monkeypatch.setattr(c, "_write", lambda *a: gate.wait(30) and real(*a))
    monkeypatch.chdir(tmp_path / "a")
    fut = c.save({"x": torch.ones(3)}, "ck.pt")
    monkeypatch.chdir(tmp_path / "b")
    gate.set()
    fut.result(30)
    assert (tmp_path / "a" / "ck.pt").exists() and not (tmp_path / "b" / "ck.pt").exists()
    c.close()


def test_async_saves_from_two_threads_share_a_bounded_pool(tmp_path, monkeypatch):
    """A second thread's save while the first still copies its snapshot
    waits for pool memory instead of being told it could never fit."""
    import threading
    from nvio.checkpoint import _async
    c = nvio.AsyncCheckpointer(pool_bytes=4 << 20)
    copying, go = threading.Event(), threading.Event()
    real = _async._snapshot

    def slow(dst, data):
        if dst is not None and dst.numel() > 1 << 20:
            copying.set()
            go.wait(30)
        return real(dst, data)
    monkeypatch.setattr(_async, "_snapshot", slow)
    out = {}
    big = {"w": torch.randn(768 << 10)}         # 3 MiB: the pool has no room for another
    a = threading.Thread(target=lambda: out.setdefault("a", c.save(big, tmp_path / "a.pt")))
    a.start()
    assert copying.wait(30)
    threading.Timer(0.3, go.set).start()
    out["b"] = c.save({"s": torch.ones(4)}, tmp_path / "b.pt")   # waits for a's buffer
    a.join(30)
    assert out["a"].result(30) > 0 and out["b"].result(30) > 0
    assert torch.equal(nvio.load(tmp_path / "a.pt")["w"], big["w"])
    c.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_async_save_being_written_at_fork_fails_in_the_child(tmp_path, monkeypatch):
    """A child forked while a save is being written gets that save's future
    failed with ECHILD (the parent writes it), as queued ones: none hangs."""
    import threading
    c = nvio.AsyncCheckpointer()
    gate, writing = threading.Event(), threading.Event()
    real = c._write

    def held(*a):
        writing.set()
        gate.wait(30)
        return real(*a)
    monkeypatch.setattr(c, "_write", held)
    first = c.save({"x": torch.ones(3)}, tmp_path / "a.pt")
    queued = c.save({"x": torch.ones(4)}, tmp_path / "b.pt")
    assert writing.wait(30)
    pid = os.fork()
    if pid == 0:                              # the child: report through the exit code
        code = 0
        for k, fut in enumerate((first, queued)):
            try:
                fut.result(10)
                code |= 1 << k
            except OSError as e:
                if e.errno != errno.ECHILD:
                    code |= 4 << k
            except BaseException:           # noqa: BLE001 - a timeout
                code |= 16 << k
        os._exit(code)
    gate.set()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert first.result(30) > 0 and queued.result(30) > 0
    c.close()


def test_async_error_goes_to_the_future(tmp_path):
    fut = nvio.async_save({"a": torch.ones(2)}, tmp_path / "missing" / "x.pt")
    with pytest.raises(FileNotFoundError):
        fut.result(60)
    with pytest.raises(nvio.CheckpointError):
        nvio.async_save({"f": lambda: 1}, tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()


EXIT_SCRIPT = r"""
import sys, torch, nvio
from nvio.checkpoint import AsyncCheckpointer
c = AsyncCheckpointer(on_exit=sys.argv[2])
c.save({"w": torch.full((8 << 20,), 7.0)}, sys.argv[1])
print("queued", flush=True)
"""


@pytest.mark.parametrize("policy", ["wait", "abandon"])
def test_exit_waits_or_abandons_cleanly(tmp_path, policy):
    p = tmp_path / "exit.pt"
    torch.save({"old": torch.ones(1)}, p)
    before = p.read_bytes()
    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(p), policy],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "queued" in r.stdout
    if policy == "wait":
        got = nvio.load(p)
        assert torch.equal(got["w"], torch.full((8 << 20,), 7.0))
    else:
        # abandoned before or after its commit: either state, never a mix
        data = p.read_bytes()
        if data != before:
            assert torch.equal(nvio.load(p)["w"], torch.full((8 << 20,), 7.0))
    assert os.listdir(tmp_path) == ["exit.pt"]


def test_async_save_snapshot_copied_by_several_threads(tmp_path, monkeypatch):
    """A large state's host storages are cut into pieces that the caller and
    helper threads copy in turn (here with the thresholds made small): every
    byte lands at its record, the snapshot is taken before async_save
    returns, and storages of odd sizes split across pieces come out whole."""
    from nvio.checkpoint import _async
    monkeypatch.setattr(_async, "PARALLEL_COPY_MIN", 1 << 16)
    monkeypatch.setattr(_async, "COPY_CHUNK", 3001)     # pieces end anywhere
    g = torch.Generator().manual_seed(7)
    state = {"w%d" % i: torch.randn(1000 + 37 * i, generator=g) for i in range(20)}
    state["b"] = torch.randint(0, 255, (77777,), dtype=torch.uint8, generator=g)
    state["view"] = state["w3"][5:905]                    # a storage shared with w3
    snap = {k: v.clone() for k, v in state.items()}
    fut = nvio.async_save(state, tmp_path / "p.pt")
    for v in state.values():
        v.zero_()                                       # the caller goes on at once
    fut.result(60)
    for got in (torch.load(tmp_path / "p.pt"), nvio.load(tmp_path / "p.pt")):
        assert sorted(got) == sorted(snap)
        assert all(torch.equal(got[k], snap[k]) for k in snap)
        assert got["view"].untyped_storage().data_ptr() == got["w3"].untyped_storage().data_ptr()
