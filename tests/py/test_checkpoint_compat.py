"""nvio.compat's deepspeed.io writers: FastFileWriter, MockFileWriter, PyFileWriter.

Each file a writer leaves is compared byte for byte with what torch.save
writes to memory for the same object, and loaded with plain torch.load; on
every engine, direct I/O on and off, single and double buffer, staging sizes
that are and are not multiples of the page size, tensors of odd sizes. The
error paths leave the old file as it was and no temporary behind.
"""
import errno
import io
import os

import pytest

import nvio_testutil

import nvio
from nvio.compat import (FastFileWriter, FastFileWriterConfig,
                         MockFileWriter, PyFileWriter)

torch = pytest.importorskip("torch")


def state(seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(300, 41, generator=g)
    return {
        "w": torch.randn(256, 1024, generator=g),            # 1 MiB: written straight
        "odd": [torch.randint(0, 250, (n,), dtype=torch.uint8, generator=g)
                for n in (1, 4095, 4097, 65537, (1 << 20) + 3)],
        "view": base[::3], "base": base, "bf16": torch.randn(77, generator=g).bfloat16(),
        "scalar": torch.tensor(7), "empty": torch.empty(0), "step": 3,
    }


def torch_bytes(obj, **kw):
    b = io.BytesIO()
    torch.save(obj, b, **kw)
    return b.getvalue()


def equal(a, b):
    """Bitwise, with the types of containers and tensors, and the layout."""
    return nvio_testutil.same(a, b, layout=True)


def config(handle, size, double, **kw):
    return FastFileWriterConfig(dnvme_handle=handle, double_buffer=double,
                                pinned_tensor=torch.zeros(size, dtype=torch.uint8), **kw)


@pytest.mark.parametrize("double", [True, False], ids=["double", "single"])
@pytest.mark.parametrize("staging", [3 * 4096 + 7, 256 << 10], ids=["odd_staging", "256k"])
def test_fast_writer_equals_torch_save(handle, double, staging, tmp_path):
    obj = state(1)
    p = tmp_path / "ck.pt"
    w = FastFileWriter(file_path=str(p), config=config(handle, staging, double))
    torch.save(obj, w)
    assert not p.exists()                 # nothing before close
    w.close()
    assert p.read_bytes() == torch_bytes(obj)
    equal(torch.load(p, weights_only=True), obj)
    assert os.listdir(tmp_path) == ["ck.pt"]
    s = w.stats()
    assert s["bytes"] == s["aio_bytes"] == p.stat().st_size
    assert s["close"] == 1 and s["write"] > 10 and s["write_secs"] > 0


def test_fast_writer_legacy_format_and_aligned_end(handle, tmp_path):
    obj = state(2)
    for kw, name in [({"_use_new_zipfile_serialization": False}, "legacy.pt"), ({}, "z.pt")]:
        p = tmp_path / name
        with FastFileWriter(p, config(handle, 8192, True)) as w:
            torch.save(obj, w, **kw)
        assert p.read_bytes() == torch_bytes(obj, **kw)
        equal(torch.load(p, weights_only=True), obj)
    # a stream whose length is a multiple of the staging halves (no tail)
    p = tmp_path / "exact.bin"
    with FastFileWriter(p, config(handle, 8192, True)) as w:
        data = os.urandom(4096 * 5)
        for i in range(0, len(data), 1000):
            w.write(data[i:i + 1000])
    assert p.read_bytes() == data


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_defaults_and_storage_list_hook(tmp_path):
    """No handle, no staging given: nvio's; the storage-list hook writes each
    storage's element count and bytes as torch's legacy format does."""
    p = tmp_path / "hook.bin"
    a, b = torch.arange(10, dtype=torch.int32), torch.randn(3, 5)
    w = FastFileWriter(p)
    w.write(b"head")
    w.save_torch_storage_object_list([(a.untyped_storage(), torch.int32), b.storage(), b,
                                      a.untyped_storage()], True)
    w.close()
    want = b"head"
    for t, n in ((a, 10), (b, 15), (b, 15), (a, 40)):     # element counts
        want += n.to_bytes(8, "little") + t.numpy().tobytes()
    assert p.read_bytes() == want
    assert w.stats()["save_storage"] == 4
    # save_size=False: bytes only
    p2 = tmp_path / "hook2.bin"
    with PyFileWriter(p2) as pw:
        pw.save_torch_storage_object_list([a.untyped_storage()], False)
    assert p2.read_bytes() == a.numpy().tobytes()


def test_longer_old_file_intact_until_commit(handle, tmp_path):
    p = tmp_path / "ck.pt"
    old = os.urandom(3 << 20)
    p.write_bytes(old)
    obj = {"small": torch.arange(100)}
    w = FastFileWriter(p, config(handle, 16384, True))
    torch.save(obj, w)
    assert p.read_bytes() == old
    w.close()
    assert p.read_bytes() == torch_bytes(obj)         # no tail of the old file
    assert os.listdir(tmp_path) == ["ck.pt"]


def test_error_or_drop_leaves_old_file(handle, tmp_path):
    p = tmp_path / "ck.pt"
    old = torch_bytes({"old": torch.ones(5)})
    p.write_bytes(old)

    class Bad:
        def __reduce__(self):
            raise RuntimeError("cannot pickle this")

    with pytest.raises(RuntimeError):
        with FastFileWriter(p, config(handle, 8192, True)) as w:
            torch.save({"t": torch.randn(5000), "bad": Bad()}, w)
    assert p.read_bytes() == old
    w = FastFileWriter(p, config(handle, 8192, False))
    torch.save(state(3), w)
    w.abandon()
    w = FastFileWriter(p, config(handle, 8192, True))
    torch.save(state(3), w)
    del w                                   # dropped without close: no commit
    assert p.read_bytes() == old
    for W in (PyFileWriter, MockFileWriter):
        w = W(p)
        torch.save(state(3), w)
        assert p.read_bytes() == old
        w.abandon()
    assert p.read_bytes() == old
    assert os.listdir(tmp_path) == ["ck.pt"]
    with pytest.raises(ValueError):
        w.write(b"x")                        # closed


def test_bad_arguments(tmp_path):
    h = nvio.AioHandle()
    missing = tmp_path / "no" / "ck.pt"
    with pytest.raises(FileNotFoundError) as ei:
        FastFileWriter(missing, config(h, 8192, True))
    assert str(missing) in str(ei.value)
    with pytest.raises(FileNotFoundError):
        PyFileWriter(missing)
    with pytest.raises(ValueError, match="too small"):
        FastFileWriter(tmp_path / "a", config(h, 8191, True))
    with pytest.raises(ValueError, match="writer_rank"):
        FastFileWriter(tmp_path / "a", config(h, 8192, True, writer_rank=1))
    with pytest.raises(ValueError, match="torch.distributed"):
        FastFileWriter(tmp_path / "a", config(h, 8192, True, num_parallel_writers=2,
                                              writer_rank=1))
    with pytest.raises(TypeError, match="dnvme_handle"):
        FastFileWriter(tmp_path / "a", FastFileWriterConfig(dnvme_handle=object()))
    with pytest.raises(TypeError):
        FastFileWriter(tmp_path / "a", config={"double_buffer": True})
    assert os.listdir(tmp_path) == []
    h.close()


def test_full_disk(tmpfs):
    mnt = tmpfs("small", "size=2m")
    p = mnt / "ck.pt"
    old = torch_bytes({"old": torch.ones(1000)})
    p.write_bytes(old)
    big = {"new": torch.ones(1 << 20)}                  # 4 MiB > 2 MiB
    for make in (lambda: FastFileWriter(p, config(nvio.AioHandle(), 65536, True)),
                 lambda: FastFileWriter(p, config(nvio.AioHandle(), 65536, False)),
                 lambda: PyFileWriter(p)):
        for use_with in (True, False):
            with pytest.raises(OSError) as ei:
                if use_with:
                    with make() as w:
                        torch.save(big, w)
                else:
                    w = make()
                    torch.save(big, w)
                    w.close()
            assert ei.value.errno == errno.ENOSPC, ei.value
            assert str(p) in str(ei.value)
            assert p.read_bytes() == old
            assert os.listdir(mnt) == ["ck.pt"]
            with pytest.raises(ValueError):
                w.write(b"x")


def test_mock_and_py_writers(tmp_path, capsys):
    obj = state(4)
    ref = torch_bytes(obj)
    p = tmp_path / "mock.pt"
    w = MockFileWriter(p)
    torch.save(obj, w)
    w.close()
    assert w.stats()["bytes"] == len(ref) and p.read_bytes() == b""
    w._dump_state()
    assert "stats = {" in capsys.readouterr().out
    p.write_bytes(b"keep")
    with MockFileWriter(p) as w:
        torch.save(obj, w)
    assert p.read_bytes() == b"keep"            # an existing file is not touched
    q = tmp_path / "py.pt"
    q.write_bytes(os.urandom(5 << 20))
    w = PyFileWriter(q)
    torch.save(obj, w)
    assert w.fileno() == -1
    w.close()
    assert q.read_bytes() == ref
    assert w.stats()["bytes"] == len(ref)
    assert sorted(os.listdir(tmp_path)) == ["mock.pt", "py.pt"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_staging(tmp_path):
    h = nvio.compat.GDSBuilder().load().gds_handle()
    st = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    obj = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in state(5).items()
           if k != "odd"}
    p = tmp_path / "g.pt"
    with FastFileWriter(p, FastFileWriterConfig(dnvme_handle=h, pinned_tensor=st)) as w:
        torch.save(obj, w)
    assert p.read_bytes() == torch_bytes(obj)


# --- parallel writers of one file ------------------------------------------------

RANK_SCRIPT = r"""
import datetime, json, os, sys
import torch, torch.distributed as dist
import nvio
from nvio.compat import FastFileWriter, FastFileWriterConfig

rank, world, port, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                        world_size=world, timeout=datetime.timedelta(seconds=60))
sys.path.insert(0, sys.argv[5])
from test_checkpoint_compat import state
path = os.path.join(d, "ck.pt")
out = {"rank": rank}

def save(obj, double, stripe, staging):
    cfg = FastFileWriterConfig(dnvme_handle=nvio.AioHandle(engine=os.environ["ENG"]),
                               pinned_tensor=torch.zeros(staging, dtype=torch.uint8),
                               double_buffer=double, num_parallel_writers=world,
                               writer_rank=rank, global_rank=rank, stripe_bytes=stripe)
    w = FastFileWriter(path, cfg)
    torch.save(obj, w)
    w.close()
    return w.stats()

cases = [(True, 8192, 3 * 4096 + 5), (False, 1 << 20, 65536)]
for i, (double, stripe, staging) in enumerate(cases):
    s = save(state(i), double, stripe, staging)
    dist.barrier()
    out["aio_bytes_%d" % i] = s["aio_bytes"]
    out["bytes_%d" % i] = s["bytes"]
    out["file_%d" % i] = open(path, "rb").read().hex() if rank == 0 else None
try:
    save(state(7 + rank), True, 8192, 65536)      # not the same object everywhere
    out["mismatch"] = "no error"
except Exception as e:
    out["mismatch"] = "%s: %s" % (type(e).__name__, e)
class Bad:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")

try:                                           # writer 1 fails inside its with block
    cfg = FastFileWriterConfig(num_parallel_writers=world, writer_rank=rank,
                               pinned_tensor=torch.zeros(65536, dtype=torch.uint8),
                               stripe_bytes=8192)
    with FastFileWriter(path, cfg) as w:
        torch.save({"s": state(9), "bad": Bad() if rank == 1 else 0}, w)
    out["raised"] = "no error"
except Exception as e:
    out["raised"] = "%s: %s" % (type(e).__name__, e)
out["left"] = sorted(os.listdir(d))
print(json.dumps(out), flush=True)
os._exit(0)
"""


def test_parallel_writers_one_file(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    world = 2
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, OMP_NUM_THREADS="1", ENG="psync")
    res, outs = nvio_testutil.run_ranks(RANK_SCRIPT, world, [tmp_path, here], 150, env)
    assert len(res) == world, outs
    for i in range(2):
        want = torch_bytes(state(i))
        assert bytes.fromhex(res[0]["file_%d" % i]) == want
        # each writer wrote a part, the parts add up to the file
        parts = [res[r]["aio_bytes_%d" % i] for r in range(world)]
        assert all(0 < n < len(want) for n in parts) and sum(parts) == len(want), parts
        assert all(res[r]["bytes_%d" % i] == len(want) for r in range(world))
    for r in range(world):
        assert "must all save the same object" in res[r]["mismatch"], res[r]["mismatch"]
    assert "cannot pickle this" in res[1]["raised"], res[1]["raised"]
    assert "failed on writer 1" in res[0]["raised"] and "cannot pickle" in res[0]["raised"], \
        res[0]["raised"]
    assert res[0]["left"] == ["ck.pt"] and os.listdir(tmp_path) == ["ck.pt"]
    equal(torch.load(tmp_path / "ck.pt", weights_only=True), state(1))
    assert (tmp_path / "ck.pt").read_bytes() == torch_bytes(state(1))   # the failed save: old file


def test_owned_stripes_cover_the_stream_once():
    """The stripe arithmetic alone: every byte owned by exactly one writer."""
    class W(FastFileWriter):
        def __init__(self, n, rank, stripe):
            self._n, self._rank, self._stripe = n, rank, stripe
    for n in (1, 2, 3, 5):
        for stripe in (4096, 8192):
            total = 7 * stripe + 123
            owner = [None] * total
            for rank in range(n):
                w = W(n, rank, stripe)
                pos = 0
                for step in (1, 4095, 3 * stripe + 7, 10, stripe * 2, 100000):
                    k = min(step, total - pos)
                    for a, m in w._owned(pos, k):
                        assert pos <= a and a + m <= pos + k
                        assert owner[a:a + m] == [None] * m
                        owner[a:a + m] = [rank] * m
                    pos += k
                    if pos == total:
                        break
            assert owner == [(j // stripe) % n for j in range(total)], (n, stripe)


def test_a_killed_py_writers_temporary_is_swept_by_the_next_save(tmp_path):
    """PyFileWriter's temporary carries its process as owner (libnvio's
    temp_name): once that process is killed, the next atomic save to the
    same file removes it, and `nvio clean` finds it."""
    import signal
    import subprocess
    import sys
    p = tmp_path / "py.pt"
    p.write_bytes(b"old")
    code = ("import sys, torch, time\n"
            "from nvio.compat import PyFileWriter\n"
            "w = PyFileWriter(sys.argv[1])\n"
            "w.write(b'x' * 4096)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    c = subprocess.Popen([sys.executable, "-c", code, str(p)], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert c.stdout.readline().strip() == "ready"
        temps = [n for n in os.listdir(tmp_path) if n != "py.pt"]
        assert len(temps) == 1 and temps[0].startswith(".py.pt.nvio-"), temps
        assert nvio._nvio.clean_temporaries(str(tmp_path), "py.pt", dry_run=True)[0] == 0  # alive
    finally:
        c.send_signal(signal.SIGKILL)
        c.wait(timeout=30)
    assert nvio._nvio.clean_temporaries(str(tmp_path), "py.pt", dry_run=True)[0] == 1  # dead
    assert p.read_bytes() == b"old"
    with PyFileWriter(p) as w:
        torch.save({"a": torch.arange(3)}, w)
    assert sorted(os.listdir(tmp_path)) == ["py.pt"]
    assert torch.equal(torch.load(p, weights_only=True)["a"], torch.arange(3))
