"""nvio.dcp's reader takes a checkpoint directory as untrusted input.

torch.distributed.checkpoint's FileSystemReader unpickles ``.metadata`` with
plain pickle.load (a tampered file runs code), opens whatever relative_path
the metadata names (``../../etc/hostname``), hands bytes items to a planner
that unpickles them with weights_only=False, and blocks forever on a FIFO.
nvio's reader refuses each of these (UnsafeCheckpointError, or a
CheckpointError naming the path and its type); ``trusted=True`` reads as
torch does. The crafted pickles are built here opcode by opcode.
"""
import collections
import copyreg
import io
import os
import pickle
import shutil
import struct
import subprocess
import sys
import threading
import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import nvio  # noqa: E402
import nvio.dcp as nd  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.path.dirname(nvio.__path__[0])     # the nvio this test imported


def cause(e):
    """The error a reader raised, out of DCP's CheckpointException."""
    if isinstance(e, CheckpointException):
        exc = next(iter(e.failures.values()))
        return exc[0] if isinstance(exc, tuple) else exc
    return e


def save(d, sd=None, **kw):
    sd = sd if sd is not None else {"w": torch.arange(1000, dtype=torch.float32), "n": 7}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(d, **kw), no_dist=True)
    return sd


def load(d, reader=None, **kw):
    out = {"w": torch.zeros(1000), "n": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=reader or nd.FileSystemReader(d, **kw), no_dist=True)
    return out


def refused(fn, cls=nd.UnsafeCheckpointError, match=None):
    """Run fn; the error it raised (out of DCP's wrapper), of type cls."""
    try:
        fn()
    except (Exception, CheckpointException) as e:  # noqa: BLE001
        got = cause(e)
        assert isinstance(got, cls), repr(got)
        if match:
            assert match in str(got), str(got)
        return got
    pytest.fail("no error: the reader accepted it")


# --- crafted .metadata pickles ---------------------------------------------------


def _u(s):
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b if len(b) < 256 else b"X" + struct.pack("<I", len(b)) + b


def exec_pickle(code):
    """PROTO 4; 'builtins' 'exec' STACK_GLOBAL; (code,) REDUCE; STOP."""
    return (b"\x80\x04" + _u("builtins") + _u("exec") + b"\x93" + _u(code) + b"\x85" +
            b"R" + b".")


def test_metadata_whose_pickle_runs_code_is_refused_with_no_side_effect(tmp_path):
    d = tmp_path / "ck"
    save(d)
    marker = tmp_path / "ran"
    (d / ".metadata").write_bytes(exec_pickle("open(%r, 'w').write('x')" % str(marker)))
    r = nd.FileSystemReader(d)
    e = refused(r.read_metadata, match="builtins.exec")
    assert ".metadata" in str(e)
    # dcp.load reports the refusal in its own error (it tries rank-local metadata next)
    refused(lambda: load(d), Exception, "builtins.exec")
    assert not marker.exists()


def test_protocol_0_global_and_reduce_are_refused_too(tmp_path):
    d = tmp_path / "ck"
    save(d)
    marker = tmp_path / "ran"
    blob = b"cos\nsystem\n(Vtouch " + str(marker).encode() + b"\ntR."
    (d / ".metadata").write_bytes(blob)
    refused(nd.FileSystemReader(d).read_metadata, match="os.system")
    assert not marker.exists()


def _touch_marker():
    open(os.environ["NVIO_TEST_MARKER"], "w").close()


def test_ext_opcodes_are_refused_even_when_copyreg_has_the_code_cached(tmp_path, monkeypatch):
    """EXT2 is served from copyreg's cache without a global lookup: an
    allowlist of globals alone does not stop it."""
    marker = tmp_path / "ran"
    monkeypatch.setenv("NVIO_TEST_MARKER", str(marker))
    mod = sys.modules[__name__]
    code = 0x7A51
    copyreg.add_extension(mod.__name__, "_touch_marker", code)
    try:
        ext2 = b"\x83" + struct.pack("<H", code)
        pickle.loads(b"\x80\x02" + ext2 + b".")      # the code is now in the cache
        d = tmp_path / "ck"
        save(d)
        (d / ".metadata").write_bytes(b"\x80\x02" + ext2 + b")R.")
        refused(nd.FileSystemReader(d).read_metadata, match="EXT2")
        assert not marker.exists()
    finally:
        copyreg.remove_extension(mod.__name__, "_touch_marker", code)


def test_a_memo_index_far_past_the_pickle_is_refused_before_allocating(tmp_path):
    d = tmp_path / "ck"
    save(d)
    # NONE; LONG_BINPUT 2**24 (the C unpickler would size its memo by it); STOP
    (d / ".metadata").write_bytes(b"\x80\x02N" + b"r" + struct.pack("<I", 1 << 24) + b".")
    refused(nd.FileSystemReader(d).read_metadata, match="memo index 16777216")


@pytest.mark.parametrize("via_memo", [False, True], ids=["direct", "memo"])
def test_build_on_an_allowed_class_is_refused_and_changes_nothing(tmp_path, via_memo):
    """BUILD with slot state on a class runs setattr on the class itself:
    an allowlisted class (pathlib's, DCP's own) would be changed for the
    whole process, then the real metadata follows and loads. torch's
    weights_only unpickler refuses BUILD on anything but a built value."""
    import pathlib
    d = tmp_path / "ck"
    sd = save(d)
    good = (d / ".metadata").read_bytes()
    cls = b"\x80\x02" + b"cpathlib\nPurePosixPath\n"
    if via_memo:                    # PUT 0; POP; GET 0: the class from the memo
        cls += b"q\x000h\x00"
    # (None, {"__truediv__": OrderedDict}) BUILD; POP; then the real pickle
    evil = cls + b"N}" + _u("__truediv__") + b"ccollections\nOrderedDict\ns\x86b0"
    (d / ".metadata").write_bytes(evil + good)
    assert "__truediv__" not in vars(pathlib.PurePosixPath)     # PurePath's
    try:
        refused(nd.FileSystemReader(d).read_metadata, match="BUILD at byte")
        assert "__truediv__" not in vars(pathlib.PurePosixPath)
    finally:
        if "__truediv__" in vars(pathlib.PurePosixPath):
            del pathlib.PurePosixPath.__truediv__
    (d / ".metadata").write_bytes(good)
    assert torch.equal(load(d)["w"], sd["w"])
    # REDUCE must call a global: here a value (a tuple) is called
    (d / ".metadata").write_bytes(b"\x80\x02)" + b")R.")
    refused(nd.FileSystemReader(d).read_metadata, match="REDUCE at byte")


def test_a_global_outside_the_allowlist_names_it_and_safe_globals_admits_it(tmp_path):
    import collections
    d = tmp_path / "ck"
    sd = save(d)
    md = dcp.FileSystemReader(d).read_metadata()
    md.planner_data = collections.Counter(a=1)      # a custom planner's data
    (d / ".metadata").write_bytes(pickle.dumps(md))
    refused(nd.FileSystemReader(d).read_metadata, match="collections.Counter")
    for r in (nd.FileSystemReader(d, safe_globals=[collections.Counter]),
              nd.FileSystemReader(d, trusted=True)):
        assert r.read_metadata().planner_data == collections.Counter(a=1)
        assert torch.equal(load(d, r)["w"], sd["w"])


def test_metadata_that_is_not_dcp_metadata_is_a_clear_error(tmp_path):
    d = tmp_path / "ck"
    save(d)
    (d / ".metadata").write_bytes(pickle.dumps({"not": "metadata"}))
    e = refused(nd.FileSystemReader(d).read_metadata, nvio.CheckpointError, "not DCP Metadata")
    assert str(d / ".metadata") in str(e)
    (d / ".metadata").write_bytes(pickle.dumps(["x"])[:-3])
    refused(nd.FileSystemReader(d).read_metadata, nvio.CheckpointError, "corrupt")


# --- every .metadata torch 2.13 writes is read, and read the same -----------------

WRITE_ALL = r"""
import os, pathlib, sys, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._extension import ZStandard
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.testing._internal.distributed.checkpoint_utils import Rot13Example
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard, Replicate
from torch.distributed._shard import sharded_tensor
from torch.distributed._shard.sharding_spec import ChunkShardingSpec
out, port = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + port, rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
class Obj:
    def state_dict(self): return {"a": 1, "l": [1, 2.5, "x"], "t": torch.ones(3)}
    def load_state_dict(self, sd): pass
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
o = torch.optim.Adam(m.parameters())
m(torch.randn(2, 4)).sum().backward(); o.step()
ms, osd = get_state_dict(m, o)
cases = {
  "plain": ({"w": torch.randn(3, 4), "bf": torch.zeros(2, dtype=torch.bfloat16), "i": 3,
             "s": "x", "l": [torch.ones(1), 2], "n": {"q": torch.arange(5)}, "obj": Obj(),
             "cl": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
             "p": torch.nn.Parameter(torch.randn(2)), "b": b"abc", "none": None}, {}),
  "dtensor": ({"d": distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)]),
               "r": distribute_tensor(torch.randn(4), mesh, [Replicate()])}, {}),
  "sharded": ({"st": sharded_tensor.rand(ChunkShardingSpec(dim=0, placements=["rank:0/cpu"]),
                                         4, 4)}, {}),
  "optim": ({"model": ms, "optim": osd}, {}),
  "zstd": ({"w": torch.randn(10), "o": Obj()},
           {"_extensions": [ZStandard()] if ZStandard.is_available() else []}),
  "rot13": ({"w": torch.randn(10), "o": Obj()}, {"_extensions": [Rot13Example()]}),
  "per_item": ({"w": torch.randn(10), "v": torch.randn(3)},
               {"single_file_per_rank": False, "thread_count": 2}),
}
for name, (sd, kw) in cases.items():
    for kind in ("str", "path"):
        d = os.path.join(out, name + "-" + kind)
        cid = d if kind == "str" else pathlib.Path(d)
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(cid, **kw))
dcp.async_save({"w": torch.randn(3)}, checkpoint_id=os.path.join(out, "async")).result()
dcp.save({"w": torch.randn(3)}, checkpoint_id=os.path.join(out, "nodist"), no_dist=True)
dcp.save({"w": torch.randn(3)}, checkpoint_id=os.path.join(out, "local"), use_collectives=False)
dist.destroy_process_group()
"""


def test_every_metadata_torch_writes_reads_as_torch_reads_it(tmp_path):
    import nvio_testutil
    port = nvio_testutil.free_port() if hasattr(nvio_testutil, "free_port") else 29641
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([PYTHON, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", WRITE_ALL, str(tmp_path), str(port)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    dirs = sorted(os.listdir(tmp_path))
    assert len(dirs) == 17, dirs
    for name in dirs:
        d = tmp_path / name
        rank = 0 if name == "local" else None
        mine = nd.FileSystemReader(d).read_metadata(rank=rank)
        theirs = dcp.FileSystemReader(d).read_metadata(rank=rank)
        assert mine.state_dict_metadata == theirs.state_dict_metadata, name
        assert mine.storage_data == theirs.storage_data, name
        assert mine.planner_data == theirs.planner_data, name
        assert mine.storage_meta.checkpoint_id == theirs.storage_meta.checkpoint_id, name


# --- storage paths ------------------------------------------------------------------


class _FakeStorage:
    pass


class _FakeTensor:
    """Pickles as torch.save pickles a tensor, with its storage offset and
    its persistent id's storage type and element count chosen."""

    def __init__(self, offset, stype, numel):
        self.args = offset, ("storage", stype, "0", "cpu", numel)

    def __reduce__(self):
        st = _FakeStorage()
        st.pid = self.args[1]
        return (torch._utils._rebuild_tensor_v2,
                (st, self.args[0], (4,), (1,), False, collections.OrderedDict()))


class _PidPickler(pickle.Pickler):
    def persistent_id(self, obj):
        return obj.pid if isinstance(obj, _FakeStorage) else None


def _tensor_image(offset, stype, numel):
    """A torch.save zip of one float tensor of 4 elements over a record of
    16 bytes, its data.pkl built with the given storage offset and id."""
    import zipfile
    pkl = io.BytesIO()
    _PidPickler(pkl, protocol=2).dump(_FakeTensor(offset, stype, numel))
    z = io.BytesIO()
    with zipfile.ZipFile(z, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pkl.getvalue())
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/data/0", struct.pack("<4f", 1, 2, 3, 4))
        zf.writestr("archive/version", "3\n")
    return z.getvalue()


@pytest.mark.parametrize("offset,stype,match", [
    (0, "FloatStorage", None),
    (2, "FloatStorage", "reaches element 5 of a storage of 16 bytes"),
    (0, "float32", "torch.float32 is no storage type"),
], ids=["good", "view-past-its-storage", "dtype-as-storage-type"])
def test_a_tensor_image_is_checked_against_its_storage_record(tmp_path, handle, offset, stype,
                                                              match):
    """A view reaching past its storage record read the bytes after the
    record (a zip header) into the tensor; a persistent id whose type is no
    storage type escaped as AttributeError."""
    d = tmp_path / "ck"
    save(d)
    md = dcp.FileSystemReader(d).read_metadata()
    idx = next(k for k in md.storage_data if k.fqn == "w")
    info = md.storage_data[idx]
    md.state_dict_metadata["w"].size = torch.Size([4])
    md.state_dict_metadata["w"].chunks[0].sizes = torch.Size([4])
    img = _tensor_image(offset, getattr(torch, stype), 4)
    data = d / info.relative_path
    info.offset, info.length = data.stat().st_size, len(img)
    with open(data, "ab") as f:
        f.write(img)
    (d / ".metadata").write_bytes(pickle.dumps(md))
    out = {"w": torch.zeros(4), "n": 0}

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(out, storage_reader=nd.FileSystemReader(d, handle=handle), no_dist=True)
    if match is None:
        run()
        assert torch.equal(out["w"], torch.tensor([1.0, 2, 3, 4]))
        return
    e = refused(run, nvio.CheckpointError, match)
    assert "no torch.save image of a tensor" in str(e) and info.relative_path in str(e)


def _retarget(d, new_path):
    """Point every item of d's metadata at new_path (as an attacker would)."""
    md = dcp.FileSystemReader(d).read_metadata()
    for info in md.storage_data.values():
        info.relative_path = new_path
    (d / ".metadata").write_bytes(pickle.dumps(md))


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_storage_paths_outside_the_directory_are_refused(tmp_path, handle, how):
    d = tmp_path / "ck"
    sd = save(d)
    outside = tmp_path / "outside.distcp"
    shutil.copy(d / "__0_0.distcp", outside)
    if how == "dotdot":
        _retarget(d, "../outside.distcp")
    elif how == "absolute":
        _retarget(d, str(outside))
    else:
        os.unlink(d / "__0_0.distcp")
        os.symlink(outside, d / "__0_0.distcp")
    e = refused(lambda: load(d, handle=handle))
    assert "outside" in str(e) or "climbs out" in str(e) or "absolute" in str(e), str(e)
    got = load(d, handle=handle, trusted=True)      # the opt-out reads it, as torch does
    assert torch.equal(got["w"], sd["w"]) and got["n"] == 7


def test_a_symlink_inside_the_directory_is_followed(tmp_path, handle):
    d = tmp_path / "ck"
    sd = save(d)
    os.mkdir(d / "sub")
    os.rename(d / "__0_0.distcp", d / "sub" / "data")
    os.symlink("sub/data", d / "__0_0.distcp")
    assert torch.equal(load(d, handle=handle)["w"], sd["w"])


def test_bytes_items_that_torch_safe_mode_refuses_are_refused(tmp_path, handle):
    """DCP's default planner unpickles bytes items with weights_only=False:
    the reader checks them with weights_only=True first."""
    d = tmp_path / "ck"
    save(d)
    md = dcp.FileSystemReader(d).read_metadata()
    info = next(i for k, i in md.storage_data.items() if k.fqn == "n")
    marker = tmp_path / "ran"
    evil = exec_pickle("open(%r, 'w').write('x')" % str(marker))
    buf = io.BytesIO()
    torch.save(7, buf)          # a torch.save image whose pickle is replaced
    import zipfile
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for n in src.namelist():
            z.writestr(n, evil if n.endswith("data.pkl") else src.read(n))
    blob = out.getvalue()
    with open(d / info.relative_path, "r+b") as f:
        f.seek(0, 2)
        info.offset, info.length = f.tell(), len(blob)
        f.write(blob)
    (d / ".metadata").write_bytes(pickle.dumps(md))
    refused(lambda: load(d, handle=handle), match="weights_only=True")
    assert not marker.exists()


# --- FIFOs and devices: an error naming the path and its type, never a hang ---------


def _no_hang(fn, fifo, seconds=20):
    """Run fn in a thread; if it is still blocked after ``seconds`` (a FIFO's
    open waiting for a writer), release it by opening the FIFO's other end
    and fail."""
    box = {}

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            box["e"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
            try:
                os.close(os.open(fifo, flags))
            except OSError:
                pass
        t.join(10)
        pytest.fail("the reader blocked on the FIFO %s" % fifo)
    assert "e" in box, "no error: the reader accepted a FIFO"
    return cause(box["e"])


def test_a_fifo_at_metadata_is_an_error_not_a_hang(tmp_path):
    d = tmp_path / "ck"
    save(d)
    os.unlink(d / ".metadata")
    os.mkfifo(d / ".metadata")
    for trusted in (False, True):
        e = _no_hang(nd.FileSystemReader(d, trusted=trusted).read_metadata, d / ".metadata")
        assert isinstance(e, nvio.CheckpointError) and "FIFO" in str(e), repr(e)
        assert str(d / ".metadata") in str(e)


def test_a_fifo_at_a_data_file_is_an_error_not_a_hang(tmp_path, handle):
    d = tmp_path / "ck"
    save(d)
    os.unlink(d / "__0_0.distcp")
    os.mkfifo(d / "__0_0.distcp")
    e = _no_hang(lambda: load(d, handle=handle), d / "__0_0.distcp")
    assert isinstance(e, nvio.CheckpointError) and "FIFO" in str(e), repr(e)
    assert "__0_0.distcp" in str(e)


def test_a_device_at_a_data_file_is_refused_even_when_trusted(tmp_path, handle):
    d = tmp_path / "ck"
    save(d)
    os.unlink(d / "__0_0.distcp")
    os.symlink("/dev/zero", d / "__0_0.distcp")
    refused(lambda: load(d, handle=handle), match="outside the checkpoint directory")
    e = refused(lambda: load(d, handle=handle, trusted=True), nvio.CheckpointError,
                "character device")
    assert "__0_0.distcp" in str(e)


def test_a_directory_at_metadata_is_a_clear_error(tmp_path):
    d = tmp_path / "ck"
    save(d)
    os.unlink(d / ".metadata")
    os.mkdir(d / ".metadata")
    refused(nd.FileSystemReader(d).read_metadata, nvio.CheckpointError, "directory")


def test_a_metadata_file_over_the_limit_is_refused_unread(tmp_path, monkeypatch):
    d = tmp_path / "ck"
    save(d)
    monkeypatch.setattr(nd, "METADATA_MAX_BYTES", 100)
    with open(d / ".metadata", "ab") as f:
        f.truncate(4096)
    r = nd.FileSystemReader(d)
    refused(r.read_metadata, nvio.CheckpointError, "METADATA_MAX_BYTES")
