"""nvio.dcp: torch.distributed.checkpoint's storage layer on libnvio.

Multi-rank scenarios run in ONE launch of 4 rank processes (fresh
interpreters meeting through a TCP store on 127.0.0.1 with a process-group
timeout, gloo, CPU), to keep the run short: ranks 0-1 (a 2-rank group and
mesh) save (nvio's writer and DCP's), load every way, async_save, overwrite;
all 4 load the 2-rank checkpoints (2 -> 4), save their own, an FSDP2 model;
ranks 0-1 load that (4 -> 2), then an injected ENOSPC on rank 1, then rank 1
dies mid-save. Each rank prints one JSON line of results; the tests check
those and, in this process, the files left.
"""
import os
import re
import warnings

import pytest

import nvio_testutil

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.distributed.checkpoint as dcp  # noqa: E402

import nvio  # noqa: E402
import nvio.dcp as nd  # noqa: E402

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

#: dcp.save/load wrap a rank's error in CheckpointException (a BaseException)
DCP_ERRORS = (nvio.CheckpointError, CheckpointException)
ENGINES = ("io_uring", "libaio", "psync")

RANK_SCRIPT = r"""
import ctypes, datetime, errno, json, os, sys, time, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader as DcpReader, FileSystemWriter as DcpWriter
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard, Replicate, distribute_tensor
import nvio, nvio.dcp as nd

rank, world, port, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                        world_size=world, timeout=datetime.timedelta(seconds=60))
# every rank builds both meshes (group creation is collective); ranks 0-1
# also form a 2-rank world of their own for the 2-rank scenarios
mesh4 = init_device_mesh("cpu", (world,))
mesh2 = DeviceMesh("cpu", [0, 1])
G4, G2 = dist.group.WORLD, (mesh2.get_group() if rank < 2 else None)
mesh, G = mesh2, G2

def full(seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(300, 40, generator=g)
    return {"w": torch.randn(4096, 96, generator=g), "w2": torch.randn(60, 300, generator=g),
            "bf": torch.randn(1000, generator=g).bfloat16(), "b": torch.randn(33, generator=g),
            "t": base.t(), "v": base[17:29], "i": torch.arange(1001, dtype=torch.int64) * seed}

def make(seed, zero=False):
    f = full(seed)
    if zero:
        f = {k: torch.zeros_like(v) for k, v in f.items()}
    return {"model": {"w": distribute_tensor(f["w"], mesh, [Shard(0)]),
                      "w2": distribute_tensor(f["w2"], mesh, [Shard(1)]),
                      "bf": distribute_tensor(f["bf"], mesh, [Shard(0)]),
                      "b": distribute_tensor(f["b"], mesh, [Replicate()]),
                      "t": f["t"], "v": f["v"], "i": f["i"]},
            "step": 0 if zero else seed, "extra": {"name": "" if zero else "run%d" % seed}}

def check(sd, seed):
    f = full(seed)
    bad = []
    for k, v in sd["model"].items():
        got = v.full_tensor() if isinstance(v, DTensor) else v
        if not (torch.equal(got, f[k]) and got.dtype == f[k].dtype):
            bad.append(k)
    if sd["step"] != seed or sd["extra"]["name"] != "run%d" % seed:
        bad.append("step/extra")
    return bad

def save(sd, writer):
    return dcp.save(sd, storage_writer=writer, process_group=G) and []

def load(path, reader):
    sd = make(0, zero=True)
    dcp.load(sd, storage_reader=reader(path), process_group=G)
    return sd

def nvw(path, timeout=20, **kw):
    return nd.FileSystemWriter(path, process_group=G, timeout=timeout, **kw)

out = {"rank": rank}
def step(name, fn):
    t = time.monotonic()
    try:
        out[name] = fn()
    except BaseException as e:      # DCP's CheckpointException is one
        out[name] = "ERROR %s: %s" % (type(e).__name__, e)
    dist.barrier(G)
    out.setdefault("times", {})[name] = round(time.monotonic() - t, 2)

P = lambda n: os.path.join(d, n)
if rank < 2:                            # 2 ranks save every way, load every way
    step("save_nvio", lambda: save(make(1), nvw(P("nv2"))))
    step("save_dcp", lambda: save(make(1), DcpWriter(P("dcp2"))))
    step("nv2_by_nvio", lambda: check(load(P("nv2"), nd.FileSystemReader), 1))
    step("nv2_by_dcp", lambda: check(load(P("nv2"), DcpReader), 1))
    step("dcp2_by_nvio", lambda: check(load(P("dcp2"), nd.FileSystemReader), 1))
    def asave():
        sd = make(2)
        w = nvw(P("async2"))
        fut = dcp.async_save(sd, storage_writer=w, process_group=G)
        for v in sd["model"].values():          # the snapshot was taken: change them
            (v.to_local() if isinstance(v, DTensor) else v).zero_()
        fut.result()
        w.close()
        return check(load(P("async2"), nd.FileSystemReader), 2)
    step("async", asave)
    def overwrite():
        res = []
        for seed in (4, 5, 6):
            save(make(seed), nvw(P("ow"), thread_count=2))
            dist.barrier(G)
            res.append((check(load(P("ow"), nd.FileSystemReader), seed), sorted(os.listdir(P("ow")))))
        return res
    step("overwrite", overwrite)
dist.barrier(G4)
mesh, G = mesh4, G4                     # 4 ranks: 2 -> 4, their own save, FSDP2
step("nv2_reshard_4", lambda: check(load(P("nv2"), nd.FileSystemReader), 1))
step("dcp2_reshard_4", lambda: check(load(P("dcp2"), nd.FileSystemReader), 1))
step("save_nv4", lambda: save(make(11), nvw(P("nv4"))))
def fsdp():
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    def model(seed):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16))
        for l in (m[0], m[2]):
            fully_shard(l, mesh=mesh)
        return fully_shard(m, mesh=mesh)
    a = model(1)
    dcp.save({"model": get_model_state_dict(a)}, storage_writer=nvw(P("fsdp")))
    res = []
    for reader in (nd.FileSystemReader, DcpReader):
        b = model(2)
        sd = {"model": get_model_state_dict(b)}
        dcp.load(sd, storage_reader=reader(P("fsdp")))
        set_model_state_dict(b, sd["model"])
        x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
        res.append(all(torch.equal(p.full_tensor(), q.full_tensor())
                       for p, q in zip(a.parameters(), b.parameters()))
                   and torch.equal(a(x), b(x)))
    return res
step("fsdp", fsdp)
if rank < 2:                            # 2 ranks: 4 -> 2, then the faults
    mesh, G = mesh2, G2
    step("nv4_reshard_2", lambda: check(load(P("nv4"), nd.FileSystemReader), 11))
    step("nv4_reshard_2_dcp", lambda: check(load(P("nv4"), DcpReader), 11))
    def enospc():
        if rank == 1:
            lib = ctypes.CDLL(None)
            lib.nvio_fault_arm.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_int, ctypes.c_char_p]
            lib.nvio_fault_arm(b"fallocate", 1, errno.ENOSPC, P("ow").encode())
        try:
            return save(make(7), nvw(P("ow")))
        finally:
            if rank == 1:
                lib.nvio_fault_arm(b"", 0, 0, None)
    step("enospc", enospc)
    step("after_enospc", lambda: check(load(P("ow"), nd.FileSystemReader), 6))
    if rank == 1:
        def die(*a, **k):
            os._exit(3)
        nd.FileSystemWriter._write_files = die
    try:
        nd.save(make(8), storage_writer=nvw(P("ow"), timeout=5), process_group=G)
        out["die"] = "saved"
    except BaseException as e:
        out["die"] = "ERROR %s: %s" % (type(e).__name__, e)
print(json.dumps(out), flush=True)
os._exit(0)     # no teardown collective with a rank that may be gone
"""


def run_ranks(world, d, preload=None, timeout=240):
    def env(r):
        e = dict(os.environ, OMP_NUM_THREADS="1")
        if preload and r == 1:
            e["LD_PRELOAD"] = preload
        return e
    return nvio_testutil.run_ranks(RANK_SCRIPT, world, [d], timeout, env)


@pytest.fixture(scope="module")
def launch(tmp_path_factory, preload):
    """One launch of 4 ranks: ranks 0-1 also run the 2-rank scenarios."""
    d = tmp_path_factory.mktemp("dcp")
    res, raw = run_ranks(4, d, preload)
    assert 0 in res and 2 in res and 3 in res, raw
    return d, res, raw


def two(launch):
    d, res, raw = launch
    assert 0 in res, raw
    return [res[r] for r in (0, 1) if r in res]


def test_two_ranks_save_and_load_every_way(launch):
    for r in two(launch):
        for k in ("save_nvio", "save_dcp", "nv2_by_nvio", "nv2_by_dcp", "dcp2_by_nvio"):
            assert r[k] == [], (k, r)
    assert sorted(os.listdir(launch[0] / "nv2")) == [".metadata", "__0_0.distcp", "__1_0.distcp"]


def test_async_save_takes_a_snapshot(launch):
    for r in two(launch):
        assert r["async"] == [], r


def test_overwrite_keeps_only_the_new_checkpoint(launch):
    for r in two(launch):
        res = r["overwrite"]
        assert isinstance(res, list), r
        for bad, files in res:
            assert bad == [], r
            assert files[0] == ".metadata" and len(files) == 5, files   # 2 ranks x 2 files
        # the first save has DCP's names; the second must not overwrite them
        assert res[0][1][1:] == ["__0_0.distcp", "__0_1.distcp", "__1_0.distcp",
                                 "__1_1.distcp"]
        assert all(n.count(".") == 2 for n in res[1][1][1:]), res[1][1]


def test_resharding_2_to_4_and_fsdp2(launch):
    d, res, raw = launch
    assert len(res) >= 3, raw
    for r in res.values():
        for k in ("nv2_reshard_4", "dcp2_reshard_4", "save_nv4"):
            assert r[k] == [], (k, r)
        assert r["fsdp"] == [True, True], r


def test_resharding_4_to_2(launch):
    for r in two(launch):
        assert r["nv4_reshard_2"] == [] and r["nv4_reshard_2_dcp"] == [], r


def test_enospc_on_one_rank_fails_every_rank_and_keeps_the_old_checkpoint(launch):
    for r in two(launch):
        assert r["enospc"].startswith("ERROR"), r
        assert "No space left" in r["enospc"] and "rank" in r["enospc"].lower(), r
        assert r["after_enospc"] == [], r


def test_a_dead_rank_is_named_and_the_old_checkpoint_loads(launch):
    d, res, raw = launch
    assert 1 not in res or res[1]["rc"] != 0, raw         # it died
    r0 = res[0]
    assert r0["die"].startswith("ERROR CheckpointError"), r0
    # nvio.dcp.save raises the error that names the rank (dcp.save would
    # raise the transport's), and the log line names it too
    assert re.search(r"\bRanks? 1\b", r0["die"]) and "not every rank finished" in r0["die"], r0
    named = [x for x in r0["stderr"].splitlines()
             if "nvio.dcp" in x and re.search(r"\bRanks? 1\b", x)]
    assert named, r0["stderr"]
    # the old checkpoint (seed 6) loads here, in one process
    sd = _load_plain(d / "ow")
    g = torch.Generator().manual_seed(6)
    torch.randn(300, 40, generator=g)
    assert torch.equal(sd["model"]["w"], torch.randn(4096, 96, generator=g))
    assert sd["step"] == 6


def _load_plain(d, reader=nd.FileSystemReader):
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    md = reader(d).read_metadata()
    sd = {}
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            sd[fqn] = torch.zeros(m.size, dtype=m.properties.dtype)
    sd = _unflatten(sd)
    sd.setdefault("step", None)
    sd.setdefault("extra", {"name": None})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(sd, storage_reader=reader(d), no_dist=True)
    return sd


def _unflatten(flat):
    out = {}
    for k, v in flat.items():
        parts = k.split(".")
        cur = out
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = v
    return out


# --- one process ------------------------------------------------------------


def state(seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(100, 37, generator=g)
    return {"a": torch.randn(3000, 64, generator=g), "t": base.t(), "v": base[10:20],
            "bf": torch.randn(77, generator=g).bfloat16(), "c": torch.randn(5, 3, generator=g,
                                                                            dtype=torch.complex64),
            "e": torch.empty(0), "step": 5, "s": "hello",
            "n": {"x": torch.arange(4099), "l": [1, torch.ones(3)]}}


def zeros_like(sd):
    if isinstance(sd, torch.Tensor):
        return torch.zeros_like(sd)
    if isinstance(sd, dict):
        return {k: zeros_like(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [zeros_like(v) for v in sd]
    return None if isinstance(sd, (int, str)) else sd


assert_same = nvio_testutil.same


def save1(sd, writer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=writer, no_dist=True)


def load1(sd, reader):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(sd, storage_reader=reader, no_dist=True)
    return sd


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
@pytest.mark.parametrize("engine", ENGINES)
def test_round_trip_and_cross_reading_on_every_engine(tmp_path, engine, direct):
    ok, why = nvio.engine_available(engine)
    if not ok:
        pytest.skip(why)
    h = nvio.AioHandle(engine=engine, direct=direct, block_size=64 << 10, intra_op_parallelism=2)
    sd = state(1)
    save1(sd, nd.FileSystemWriter(tmp_path / "nv", thread_count=3, handle=h))
    save1(sd, dcp.FileSystemWriter(tmp_path / "dc"))
    for d, reader in (("nv", nd.FileSystemReader(tmp_path / "nv", handle=h)),
                      ("nv", dcp.FileSystemReader(tmp_path / "nv")),
                      ("dc", nd.FileSystemReader(tmp_path / "dc", handle=h))):
        got = load1(zeros_like(sd) | {"step": 0, "s": "", "n": {"x": torch.zeros(4099, dtype=torch.int64), "l": [0, torch.zeros(3)]}}, reader)
        assert_same(sd, got)
    h.close()


def test_files_are_torch_save_images_and_crc32_is_optional(tmp_path):
    import zipfile
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    # "big": written straight from memory, its CRC taken by libnvio's op
    sd = {"w": torch.randn(1000, 3), "x": torch.arange(10), "big": torch.randn(300001)}
    for crc in (False, True):
        d = tmp_path / str(crc)
        save1(sd, nd.FileSystemWriter(d, crc32=crc))
        md = dcp.FileSystemReader(d).read_metadata()
        raw = (d / "__0_0.distcp").read_bytes()
        for idx, info in md.storage_data.items():
            assert type(info) is _StorageInfo
            blob = raw[info.offset:info.offset + info.length]
            import io
            t = torch.load(io.BytesIO(blob), weights_only=True)
            assert torch.equal(t, sd[idx.fqn])
            bad = zipfile.ZipFile(io.BytesIO(blob)).testzip()
            assert (bad is None) == crc, (crc, bad)


@pytest.mark.parametrize("crc", [True, False])
def test_packed_rank_files_are_the_files_written_straight(tmp_path, monkeypatch, crc):
    """A rank file of many small host tensors is written as its image through
    windows (raw items, every archive, zeros between): byte for byte the
    file written straight from the tensors, with or without CRC-32s, and
    it loads back; the packed path is really taken (windows smaller than
    the file)."""
    g = torch.Generator().manual_seed(5)
    sd = {"t%d" % i: torch.randn(30 + 7 * i, generator=g) for i in range(200)}
    sd["big"] = torch.arange(100000, dtype=torch.int64)
    sd["empty"] = torch.empty(0)
    sd["step"] = 7
    sd["note"] = {"text": "x" * 3000}
    from nvio._base import plan as _plan
    monkeypatch.setattr(_plan, "PACK_WINDOW", 64 << 10)
    monkeypatch.setattr(_plan._ids, "getrandbits", lambda k: 12345)  # one serialization id
    calls = []
    orig = nd._write_streamed
    monkeypatch.setattr(nd, "_write_streamed", lambda *a: calls.append(1) or orig(*a))
    out = {}
    for packed in (True, False):
        monkeypatch.setattr(nd, "_packed", lambda tensors, packed=packed: packed)
        d = tmp_path / str(packed)
        save1(sd, nd.FileSystemWriter(d, thread_count=2, crc32=crc))
        out[packed] = {n: (d / n).read_bytes() for n in sorted(os.listdir(d))
                       if n.endswith(".distcp")}
    assert len(calls) == 2
    assert out[True] == out[False] and len(out[True]) == 2
    zero = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v
            for k, v in sd.items()}
    assert_same(sd, load1(zero | {"step": 0, "note": {"text": ""}},
                          nd.FileSystemReader(tmp_path / "True")))


def _many_small(n, seed):
    g = torch.Generator().manual_seed(seed)
    sd = {"t%d" % i: torch.randn(700 + 13 * i, generator=g) for i in range(n)}
    sd["step"] = seed
    return sd


@pytest.mark.parametrize("engine", ENGINES)
def test_streamed_rank_file_is_written_while_its_items_are_laid_out(tmp_path, monkeypatch,
                                                                     engine):
    """A rank file of many small tensors goes window by window while its
    items are still being laid out: the first window is filled before the
    last item's Plan is made; the file is allocated once up front, then
    cut to its exact size (the direct writer's file, byte for byte), and
    it loads back through both readers. On every engine."""
    ok, why = nvio.engine_available(engine)
    if not ok:
        pytest.skip(why)
    from nvio._base import plan as _plan
    monkeypatch.setattr(_plan, "PACK_WINDOW", 64 << 10)
    monkeypatch.setattr(_plan._ids, "getrandbits", lambda k: 777)   # one serialization id
    sd = _many_small(300, 1)
    events = []
    orig_plan, orig_fill = nd.Plan, _plan.fill_window
    monkeypatch.setattr(nd, "Plan", lambda *a, **k: events.append("plan") or orig_plan(*a, **k))
    monkeypatch.setattr(_plan, "fill_window",
                        lambda *a: events.append("window") or orig_fill(*a))
    allocs = []
    orig_alloc = _plan.ImageStream._allocate
    monkeypatch.setattr(_plan.ImageStream, "_allocate",
                        lambda self, close: allocs.append(self.allocated) or
                        orig_alloc(self, close))
    h = nvio.AioHandle(engine=engine, block_size=64 << 10)
    save1(sd, nd.FileSystemWriter(tmp_path / "s", handle=h))
    last_plan = len(events) - 1 - events[::-1].index("plan")
    assert events.count("plan") == 300 and events.index("window") < last_plan // 2, events
    assert events.count("window") > 30
    # one fallocate (the estimate) before the first write; none after it
    assert allocs[0] == 0 and all(a == allocs[1] for a in allocs[1:]), allocs
    monkeypatch.setattr(nd, "_packed", lambda tensors: False)
    save1(sd, nd.FileSystemWriter(tmp_path / "d", handle=h))
    names = [n for n in os.listdir(tmp_path / "s") if n.endswith(".distcp")]
    assert names and all((tmp_path / "s" / n).read_bytes() == (tmp_path / "d" / n).read_bytes()
                         for n in names)
    zero = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in sd.items()}
    for reader in (nd.FileSystemReader(tmp_path / "s", handle=h),
                   dcp.FileSystemReader(tmp_path / "s")):
        assert_same(sd, load1(dict(zero), reader))
    h.close()


def test_small_streamed_rank_file_holds_no_full_size_window(tmp_path, monkeypatch):
    """A streamed rank file far smaller than a window (70 tiny tensors) gets
    window buffers no larger than its estimated size, not PACK_WINDOW's
    32 MiB of locked memory; it loads back."""
    from nvio._base import plan as _plan
    windows = []
    orig = _plan.ImageStream.__init__

    def init(self, *a, **k):
        orig(self, *a, **k)
        windows.append(self.window)
    monkeypatch.setattr(_plan.ImageStream, "__init__", init)
    sd = {"t%d" % i: torch.full((10 + i,), float(i)) for i in range(70)}
    save1(sd, nd.FileSystemWriter(tmp_path))
    size = os.path.getsize(tmp_path / "__0_0.distcp")
    assert len(windows) == 1 and windows[0] < 2 * size + 70 * 8192 < _plan.PACK_WINDOW, \
        (windows, size)
    assert_same(sd, load1({k: torch.zeros_like(v) for k, v in sd.items()},
                          nd.FileSystemReader(tmp_path)))


def test_streamed_rank_file_on_a_full_disk(tmpfs, tmp_path, monkeypatch):
    """A streamed rank file on a small file system: one that cannot hold
    it fails with ENOSPC and leaves the old checkpoint whole and nothing
    else; one that holds the file but not the writer's estimate of it
    (each image taken as two pages more than its tensor) succeeds, the
    file cut to its size."""
    import errno
    from nvio._base import plan as _plan
    monkeypatch.setattr(_plan, "PACK_WINDOW", 64 << 10)
    monkeypatch.setattr(_plan.ImageStream, "ALLOC_STEP", 256 << 10)
    mnt = tmpfs("full", "size=3m")
    old = {"old": torch.ones(1000)}
    save1(old, nd.FileSystemWriter(mnt))
    before = sorted(os.listdir(mnt))
    big = {"t%d" % i: torch.randn(300 + i) for i in range(600)}      # ~5 MB of images
    with pytest.raises(DCP_ERRORS) as ei:
        save1(big, nd.FileSystemWriter(mnt))
    assert "No space left" in str(ei.value) or errno.ENOSPC == getattr(ei.value, "errno", 0)
    assert sorted(os.listdir(mnt)) == before
    assert_same(old, load1({"old": torch.zeros(1000)}, nd.FileSystemReader(mnt)))
    # sized for the file, not for the estimate
    sd = {"t%d" % i: torch.randn(200 + i) for i in range(200)}
    save1(sd, nd.FileSystemWriter(tmp_path / "probe"))
    size = os.path.getsize(tmp_path / "probe" / "__0_0.distcp")
    estimate = sum(2 * 4096 + -(-t.nbytes // 4096) * 4096 for t in sd.values())
    room = size + (256 << 10)
    assert estimate > room
    fits = tmpfs("fits", "size=%dk" % (room >> 10))
    save1(sd, nd.FileSystemWriter(fits))
    assert os.path.getsize(fits / "__0_0.distcp") == size
    assert_same(sd, load1({k: torch.zeros_like(v) for k, v in sd.items()},
                          nd.FileSystemReader(fits)))


def test_async_save_streams_a_staged_rank_file(tmp_path, monkeypatch):
    """dcp.async_save with nvio's writer and many small tensors: the rank
    file streams from the staged snapshot on DCP's background thread; the
    tensors changed right after the call do not reach the file, which loads
    back equal to the state at the call."""
    calls = []
    orig = nd._write_streamed
    monkeypatch.setattr(nd, "_write_streamed", lambda *a: calls.append(1) or orig(*a))
    sd = _many_small(200, 4)
    want = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in sd.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fut = nd.async_save(sd, checkpoint_id=tmp_path, no_dist=True)
        for v in sd.values():
            if isinstance(v, torch.Tensor):
                v.fill_(-1.0)
        fut.result(timeout=120)
    assert calls == [1]
    zero = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in want.items()}
    assert_same(want, load1(zero, nd.FileSystemReader(tmp_path)))


def test_streamed_save_that_fails_midway_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    """An error while a streamed rank file is half written (its 200th item
    fails to lay out, windows already on disk): the save fails with that
    error, no write is left in flight, no temporary or new data file is
    left, and the previous checkpoint loads whole."""
    from nvio._base import plan as _plan
    monkeypatch.setattr(_plan, "PACK_WINDOW", 64 << 10)
    old = _many_small(300, 2)
    save1(old, nd.FileSystemWriter(tmp_path))
    before = sorted(os.listdir(tmp_path))
    made, closed = [], []
    orig_plan = nd.Plan

    def plan(*a, **k):
        made.append(1)
        if len(made) == 200:
            raise RuntimeError("injected: item 200 cannot be laid out")
        return orig_plan(*a, **k)
    monkeypatch.setattr(nd, "Plan", plan)
    orig_close = _plan.ImageStream.close
    monkeypatch.setattr(_plan.ImageStream, "close",
                        lambda self: closed.append(dict(self.futs)) or orig_close(self))
    with pytest.raises(DCP_ERRORS, match="item 200"):
        save1(_many_small(300, 3), nd.FileSystemWriter(tmp_path))
    monkeypatch.undo()
    assert closed and closed[0], "the failure came before any window was written"
    assert sorted(os.listdir(tmp_path)) == before
    zero = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in old.items()}
    assert_same(old, load1(zero, nd.FileSystemReader(tmp_path)))


def test_no_collection_runs_while_the_data_files_are_written(tmp_path, monkeypatch):
    """The writer pauses the cyclic collector while it lays out and writes
    its images (a Plan each, thousands of records): with thresholds so low
    that 300 items would start hundreds of collections, none starts inside
    _write_files; the collector is on after the save, which loads back."""
    import gc
    sd = {"t%d" % i: torch.full((50 + i,), float(i)) for i in range(300)}
    inside = []
    orig = nd.FileSystemWriter._write_files
    with nvio_testutil.low_gc_thresholds() as events:
        def spy(self, *a):      # the collections started inside _write_files
            n = len(events)
            try:
                return orig(self, *a)
            finally:
                inside.append(events[n:])
        monkeypatch.setattr(nd.FileSystemWriter, "_write_files", spy)
        save1(sd, nd.FileSystemWriter(tmp_path))
    assert inside == [[]] and gc.isenabled()
    assert_same(sd, load1({k: torch.zeros_like(v) for k, v in sd.items()},
                          nd.FileSystemReader(tmp_path)))


def test_no_collection_runs_while_the_metadata_is_pickled(tmp_path, monkeypatch):
    """finish() pickles .metadata (an entry per item) with the collector
    paused: with thresholds so low that 300 items' metadata would start
    collections, none starts inside that pickle.dumps; the checkpoint
    loads back."""
    import gc
    sd = {"t%d" % i: torch.full((50 + i,), float(i)) for i in range(300)}
    inside = []
    orig = nd.pickle.dumps
    with nvio_testutil.low_gc_thresholds() as events:
        def spy(*a, **k):
            n = len(events)
            try:
                return orig(*a, **k)
            finally:
                inside.append(events[n:])
        monkeypatch.setattr(nd.pickle, "dumps", spy)
        save1(sd, nd.FileSystemWriter(tmp_path))
        monkeypatch.undo()
    assert inside == [[]] and gc.isenabled()
    assert_same(sd, load1({k: torch.zeros_like(v) for k, v in sd.items()},
                          nd.FileSystemReader(tmp_path)))



def test_nvio_dcp_calls_run_without_collections(tmp_path, monkeypatch):
    """nvio.dcp.save, async_save and load pause the cyclic collector for
    their call, DCP's own planning included (a full collection there walks
    every object of the process: 0.12 s with torch imported): with
    thresholds so low that 300 items start collections, none starts inside
    DCP's save, async_save or load called from them, while dcp.save with
    nvio's writer called directly starts some (so the thresholds do fire).
    The collector is on after each call; the checkpoints load back."""
    import gc
    sd = {"t%d" % i: torch.full((50 + i,), float(i)) for i in range(300)}
    seen = []
    with nvio_testutil.low_gc_thresholds() as events:
        for name in ("save", "async_save", "load"):
            def spy(*a, _orig=getattr(dcp, name), _name=name, **k):
                n = len(events)
                try:
                    return _orig(*a, **k)
                finally:        # still inside the call: no collection may
                    seen.append((_name, events[n:]))    # have started since n
            monkeypatch.setattr(dcp, name, spy)
        save1(sd, nd.FileSystemWriter(tmp_path / "plain"))
        assert gc.isenabled()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nd.save(sd, checkpoint_id=tmp_path / "s", no_dist=True)
            assert gc.isenabled()
            nd.async_save(sd, checkpoint_id=tmp_path / "a", no_dist=True).result(60)
            assert gc.isenabled()
            for d in ("s", "a"):
                got = {k: torch.zeros_like(v) for k, v in sd.items()}
                nd.load(got, checkpoint_id=tmp_path / d, no_dist=True)
                assert gc.isenabled()
                assert_same(sd, got)
    monkeypatch.undo()
    assert seen[0][0] == "save" and seen[0][1], \
        "dcp.save with nvio's writer started no collection: the test proves nothing"
    assert seen[1:] == [("save", []), ("async_save", []), ("load", []), ("load", [])]


def _alike_state():
    """Items of a few shapes and dtypes, each many times (a model's layers),
    and items that differ from each other only in shape or dtype or size."""
    g = torch.Generator().manual_seed(9)
    sd = {}
    for i in range(40):
        sd["l%d.w" % i] = torch.randn(24, 16, generator=g)
        sd["l%d.b" % i] = torch.randn(16, generator=g)
        sd["l%d.h" % i] = torch.randn(16, generator=g).half()     # same numel, other dtype
        sd["l%d.t" % i] = torch.randn(16, 24, generator=g)        # same numel, other shape
        sd["l%d.step" % i] = torch.tensor(float(i))
    sd["odd"] = torch.randn(17, generator=g)
    sd["big"] = torch.arange(300001, dtype=torch.int64)
    return sd


@pytest.mark.parametrize("crc", [False, True])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "direct"])
def test_alike_items_share_layouts_and_write_the_same_bytes(tmp_path, monkeypatch, crc,
                                                             packed):
    """Items whose images come out alike (same pickle, same storage sizes)
    reuse the first one's layout (Plan(layouts=)): the rank files are byte
    for byte the files laid out item by item (one serialization id for
    the comparison), on the packed and the direct writer, with and without
    CRC-32s; they load back through nvio's reader and DCP's, and every
    image is a zip whose CRCs check when crc32=True."""
    import io
    import zipfile
    from nvio._base import plan as _plan
    sd = _alike_state()
    reused = []
    orig_like = _plan.Plan._lay_out_like
    monkeypatch.setattr(_plan.Plan, "_lay_out_like",
                        lambda self, like: reused.append(1) or orig_like(self, like))
    monkeypatch.setattr(nd, "_packed", lambda tensors: packed)
    orig_plan = nd.Plan
    out = {}
    for share in (True, False):
        with monkeypatch.context() as m:
            if not share:
                m.setattr(nd, "Plan", lambda *a, layouts=None, **k: orig_plan(*a, **k))
            m.setattr(_plan._ids, "getrandbits", lambda k: 12345)   # one serialization id
            d = tmp_path / ("%s" % share)
            save1(sd, nd.FileSystemWriter(d, crc32=crc))
        out[share] = (d / "__0_0.distcp").read_bytes()
        if share:
            # 5 kinds of alike items, 40 of each: all but the first of each reused
            assert len(reused) == 5 * 39, len(reused)
    assert out[True] == out[False]
    # the ids are drawn for each image: every image has its own
    d = tmp_path / "ids"
    del reused[:]
    save1(sd, nd.FileSystemWriter(d, crc32=crc))
    assert len(reused) == 5 * 39
    md = dcp.FileSystemReader(d).read_metadata()
    raw = (d / "__0_0.distcp").read_bytes()
    ids = set()
    for idx, info in md.storage_data.items():
        z = zipfile.ZipFile(io.BytesIO(raw[info.offset:info.offset + info.length]))
        ids.add(z.read("archive/.data/serialization_id"))
        assert (z.testzip() is None) == crc
        assert torch.equal(torch.load(io.BytesIO(raw[info.offset:info.offset + info.length]),
                                      weights_only=True), sd[idx.fqn])
    assert len(ids) == len(md.storage_data)
    zero = {k: torch.zeros_like(v) for k, v in sd.items()}
    for reader in (nd.FileSystemReader(d), dcp.FileSystemReader(d)):
        assert_same(sd, load1(dict(zero), reader))


def test_single_file_per_rank_false_and_sync_files_false(tmp_path):
    sd = state(2)
    save1(sd, nd.FileSystemWriter(tmp_path, single_file_per_rank=False, sync_files=False))
    names = [n for n in os.listdir(tmp_path) if n.endswith(".distcp")]
    assert len(names) > 5
    got = load1(zeros_like(sd) | {"step": 0, "s": "", "n": {"x": torch.zeros(4099, dtype=torch.int64), "l": [0, torch.zeros(3)]}},
                dcp.FileSystemReader(tmp_path))
    assert_same(sd, got)


def test_missing_file_and_missing_metadata_are_clear_errors(tmp_path):
    sd = {"w": torch.randn(100), "x": torch.arange(10)}
    save1(sd, nd.FileSystemWriter(tmp_path / "a", thread_count=2))
    os.unlink(tmp_path / "a" / "__0_1.distcp")
    with pytest.raises(DCP_ERRORS, match=r"__0_1\.distcp is missing"):
        load1({"w": torch.zeros(100), "x": torch.zeros(10, dtype=torch.int64)},
              nd.FileSystemReader(tmp_path / "a"))
    (tmp_path / "b").mkdir()
    with pytest.raises(DCP_ERRORS, match=r"no \.metadata file"):
        load1({"w": torch.zeros(100)}, nd.FileSystemReader(tmp_path / "b"))


def test_truncated_data_file_is_a_clear_error(tmp_path):
    sd = {"w": torch.randn(10000)}
    save1(sd, nd.FileSystemWriter(tmp_path))
    p = tmp_path / "__0_0.distcp"
    os.truncate(p, os.path.getsize(p) - 5000)
    with pytest.raises(DCP_ERRORS, match="truncated"):
        load1({"w": torch.zeros(10000)}, nd.FileSystemReader(tmp_path))


def test_failed_save_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    old = {"w": torch.randn(5000), "step": 1}
    save1(old, nd.FileSystemWriter(tmp_path))
    before = sorted(os.listdir(tmp_path))

    def boom(self, *a, **k):
        raise OSError(28, "No space left on device (injected)")
    monkeypatch.setattr(nd.FileSystemWriter, "_write_files", boom)
    with pytest.raises(DCP_ERRORS, match="No space left"):
        save1({"w": torch.randn(5000), "step": 2}, nd.FileSystemWriter(tmp_path))
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == before
    got = load1({"w": torch.zeros(5000), "step": 0}, nd.FileSystemReader(tmp_path))
    assert torch.equal(got["w"], old["w"]) and got["step"] == 1


def test_reused_writer_never_writes_over_the_live_checkpoint(tmp_path, monkeypatch):
    """One writer object reused without a checkpoint_id (DCP resets it
    only with one): two saves that fail at the metadata after their data
    files went in. The last good checkpoint still loads its own data."""
    w = nd.FileSystemWriter(tmp_path)
    for k in (1, 2):
        save1({"w": torch.full((5000,), float(k))}, w)
    real = nd.FileSystemWriter.finish

    def no_metadata(self, metadata, results):
        raise OSError(28, "No space left on device (injected)")
    monkeypatch.setattr(nd.FileSystemWriter, "finish", no_metadata)
    for k in (3, 4):
        with pytest.raises(DCP_ERRORS, match="No space left"):
            save1({"w": torch.full((5000,), float(k))}, w)
    monkeypatch.setattr(nd.FileSystemWriter, "finish", real)
    got = load1({"w": torch.zeros(5000)}, nd.FileSystemReader(tmp_path))
    assert torch.equal(got["w"], torch.full((5000,), 2.0))


def test_staging_snapshots_non_tensor_values_too(tmp_path):
    """async_save's staging (stage()) copies what is written after it
    returns: tensors, and mutable non-tensor values (a numpy array, a
    bytearray), as DCP's own stager does; dict subclasses keep their type."""
    import collections
    np = pytest.importorskip("numpy")
    w = nd.FileSystemWriter(tmp_path)
    dd = collections.defaultdict(list, {"a": torch.ones(3)})
    sd = {"t": torch.arange(6.0), "perm": np.arange(8), "log": bytearray(b"epoch 3"), "dd": dd,
          "od": collections.OrderedDict(x=torch.zeros(2)), "n": 5}
    staged = w.stage(sd)
    sd["t"].fill_(-1)
    sd["perm"][:] = -1
    sd["log"][:] = b"epoch 4"
    dd["a"].fill_(-1)
    assert torch.equal(staged["t"], torch.arange(6.0)) and list(staged["perm"]) == list(range(8))
    assert staged["log"] == b"epoch 3" and torch.equal(staged["dd"]["a"], torch.ones(3))
    assert type(staged["dd"]) is collections.defaultdict and staged["dd"].default_factory is list
    assert type(staged["od"]) is collections.OrderedDict and staged["n"] == 5
    w.close()


def test_writer_can_be_sent_to_another_process(tmp_path):
    """async_save with a process executor pickles the writer: its staging
    pool and handle stay behind, the copy makes its own and saves."""
    import pickle
    w = nd.FileSystemWriter(tmp_path, handle=nvio.AioHandle())
    w.stage({"x": torch.ones(2)})
    w2 = pickle.loads(pickle.dumps(w))
    assert w2.handle is None and w2.path == w.path
    sd = {"w": torch.randn(100)}
    save1(sd, w2)
    assert torch.equal(load1({"w": torch.zeros(100)}, nd.FileSystemReader(tmp_path))["w"], sd["w"])


def test_a_file_per_item_beyond_the_descriptor_limit(tmp_path):
    """single_file_per_rank=False with more items than the process may
    open files at once: written and read in groups, both ways equal."""
    import resource
    sd = {"t%d" % i: torch.full((7,), float(i)) for i in range(300)}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = len(os.listdir("/proc/self/fd")) + 150
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        save1(sd, nd.FileSystemWriter(tmp_path, single_file_per_rank=False))
        got = load1({k: torch.zeros(7) for k in sd}, nd.FileSystemReader(tmp_path))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert sum(n.endswith(".distcp") for n in os.listdir(tmp_path)) == 300
    assert all(torch.equal(got[k], sd[k]) for k in sd)


SHARDED_SCRIPT = r"""
import datetime, json, sys, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.sharded_tensor import Shard, ShardMetadata, init_from_local_shards
import nvio.dcp as nd
rank, world, port, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=60))
local = torch.arange(12.0).reshape(4, 3)
st = init_from_local_shards([Shard(local, ShardMetadata([0, 0], [4, 3], "rank:0/cpu"))], [4, 3])
w = nd.FileSystemWriter(d)
staged = w.stage({"st": st, "x": torch.ones(2)})
local.fill_(-1)
out = {"rank": 0, "snapshot": staged["st"].local_shards()[0].tensor.tolist()}
local.copy_(torch.arange(12.0).reshape(4, 3))
nd.async_save({"st": st}, checkpoint_id=d + "/a").result(60)
dst = torch.zeros(4, 3)
got = init_from_local_shards([Shard(dst, ShardMetadata([0, 0], [4, 3], "rank:0/cpu"))], [4, 3])
dcp.load({"st": got}, checkpoint_id=d + "/a")
out["loaded"] = dst.tolist()
print(json.dumps(out), flush=True)
"""


def test_sharded_tensors_are_staged_by_dcps_stager(tmp_path):
    """FSDP1's sharded state dicts hold ShardedTensors (tensor subclasses
    without storage): async_save stages them as DCP does, and the
    snapshot keeps the values at the call."""
    res, outs = nvio_testutil.run_ranks(SHARDED_SCRIPT, 1, [tmp_path], 120)
    assert 0 in res, outs
    want = torch.arange(12.0).reshape(4, 3).tolist()
    assert res[0]["snapshot"] == want and res[0]["loaded"] == want, res


def test_non_contiguous_destination_goes_through_a_buffer(tmp_path):
    sd = {"w": torch.randn(64, 48)}
    save1(sd, nd.FileSystemWriter(tmp_path))
    dst = torch.zeros(48, 64).t()                  # non-contiguous destination
    got = load1({"w": dst}, nd.FileSystemReader(tmp_path))
    assert torch.equal(got["w"], sd["w"]) and got["w"].data_ptr() == dst.data_ptr()
    dst = torch.zeros(64, 48, dtype=torch.float64)  # another dtype: DCP converts
    got = load1({"w": dst}, nd.FileSystemReader(tmp_path))
    assert torch.equal(got["w"], sd["w"].double())


def test_nvio_dcp_save_async_save_and_load_use_nvio_storage(tmp_path):
    """nvio.dcp.save/async_save/load are dcp's with nvio's writer and reader
    by default: the files are nvio's (tensor bytes on page boundaries) and
    load back equal; DCP's own reader reads them."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    sd = {"w": torch.randn(1000, 3), "x": torch.arange(10), "step": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nd.save(sd, checkpoint_id=tmp_path / "s", no_dist=True)
        fut = nd.async_save(sd, checkpoint_id=tmp_path / "a", no_dist=True)
        fut.result(timeout=60)
        for d in ("s", "a"):
            md = dcp.FileSystemReader(tmp_path / d).read_metadata()
            raw = (tmp_path / d / "__0_0.distcp").read_bytes()
            w = next(i for i in md.storage_data if i.fqn == "w")
            info = md.storage_data[w]
            assert type(info) is _StorageInfo
            # nvio's layout: the tensor's bytes start on a page boundary
            # (DCP's own writer packs them right after the zip header)
            at = raw.find(sd["w"].numpy().tobytes(), info.offset)
            assert at >= 0 and at % 4096 == 0, (d, at)
            got = {"w": torch.zeros(1000, 3), "x": torch.zeros(10, dtype=torch.int64), "step": 0}
            nd.load(got, checkpoint_id=tmp_path / d, no_dist=True)
            assert torch.equal(got["w"], sd["w"]) and torch.equal(got["x"], sd["x"])
            assert got["step"] == 3
            got2 = {"w": torch.zeros(1000, 3), "x": torch.zeros(10, dtype=torch.int64), "step": 0}
            dcp.load(got2, storage_reader=dcp.FileSystemReader(tmp_path / d), no_dist=True)
            assert torch.equal(got2["w"], sd["w"])
