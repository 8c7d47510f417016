"""nvio.offload.Swapper: round trips, ordering under races, the pool's bounds,
striping, cleanup, checkpoints, bad input and injected faults, on every engine."""
import errno
import json
import os
import random
import signal
import subprocess
import sys
import threading

import pytest

import nvio
from nvio_testutil import same  # bitwise: NaNs and float8 too

torch = pytest.importorskip("torch")
from nvio.offload import ALIGN, SwapError, Swapper  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
          torch.uint8, torch.int64, torch.bool, torch.complex64, torch.float8_e4m3fn]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def rand(n, dtype, g):
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_floating_point and dtype.itemsize == 1:
        return torch.randn(n, generator=g).to(dtype)
    if dtype.is_complex:
        return torch.randn(n, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 10).to(dtype)
    return torch.randint(-100 if dtype.is_signed else 0, 100, (n,), generator=g).to(dtype)


@pytest.fixture
def dirs(tmp_path):
    out = []
    for i in range(2):
        d = tmp_path / ("ssd%d" % i)
        d.mkdir()
        out.append(str(d))
    return out


def test_round_trips_odd_sizes_and_dtypes(engine, direct, dirs):
    g = torch.Generator().manual_seed(1)
    sizes = [0, 1, 3, 4095, 4096, 4097, 65537, 300001]
    with Swapper(dirs, 4 << 20, engine=engine, direct=direct, stripe_min=64 << 10) as sw:
        want = {}
        for i, n in enumerate(sizes):
            for dt in DTYPES:
                t = rand(n, dt, g)
                if n == 4097:
                    t = t[:4096].view(64, 64).t()    # not contiguous
                want[(n, str(dt))] = t
                sw.swap_out((n, str(dt)), t)
        want["scalar"] = torch.tensor(3.5, dtype=torch.float64)
        sw.swap_out("scalar", want["scalar"])
        for k, t in want.items():
            u = sw.swap_in(k)
            assert same(u, t), k
            sw.release(k)
            o = torch.empty_like(t)
            assert sw.swap_in(k, out=o) is o and same(o, t), k
            if t.dim() == 2:
                o = torch.empty(t.shape[1], t.shape[0], dtype=t.dtype).t()  # into a view
                sw.swap_in(k, out=o)
                assert same(o, t), k
        # a tensor bigger than the whole pool goes straight from its memory
        big = rand((5 << 20) // 4 + 3, torch.float32, g)
        sw.swap_out("big", big)
        o = torch.empty_like(big)
        sw.swap_in("big", out=o)
        assert same(o, big)
        assert all(b > 0 for b in sw.bytes_on_disk)        # both directories used


def test_thousands_of_keys(engine, dirs):
    g = torch.Generator().manual_seed(2)
    with Swapper(dirs, 1 << 20, engine=engine) as sw:
        want = {}
        futs = []
        for i in range(1500):
            t = rand(1 + (i * 37) % 3000, DTYPES[i % 8], g)
            want[i] = t
            futs.append(sw.swap_out(i, t, async_op=True))
        t0 = want[0].clone()
        want[0].add_(1) if want[0].dtype != torch.bool else want[0].logical_not_()
        sw.wait()
        assert all(f.result() == f.user_data for f in futs)
        want[0] = t0                                   # swap_out copied it at once
        order = random.Random(3).sample(range(1500), 1500)
        for b in range(0, 1500, 100):                 # read back 100 at a time
            keys = order[b:b + 100]
            got = [f.result() for f in sw.prefetch(keys)]
            for i, u in zip(keys, got):
                assert same(u, want[i]), i
                sw.release(i)
        sw.discard(5)
        assert 5 not in sw and 6 in sw and len(sw.keys()) == 1499


def test_async_ordering_stress(engine, dirs):
    """Writers, readers and prefetches of the same keys race from threads; a
    read always sees a value written under that key, a thread sees its own
    last write, and the end state is each key's last write."""
    n_keys, rounds = 12, 150
    with Swapper(dirs, 2 << 20, engine=engine, stripe_min=16 << 10) as sw:
        vals = {}                       # (key, version) -> tensor
        last = {}
        lock = threading.Lock()
        for k in range(n_keys):
            vals[(k, 0)] = torch.full((20000 + k,), float(k * 1000), dtype=torch.float32)
            sw.swap_out(k, vals[(k, 0)])
            last[k] = 0
        errors = []

        def version_of(k, t):
            v = (t[0].item() - k * 1000)
            return int(v) if v == int(v) and torch.all(t == t[0]) else None

        def worker(seed):
            rng = random.Random(seed)
            mine = {}
            try:
                for _ in range(rounds):
                    k = rng.randrange(n_keys)
                    op = rng.random()
                    if op < 0.35:
                        # writers of one key from several threads: the swapper
                        # orders them as their calls return; number them so
                        with lock:
                            v = last[k] = last[k] + 1
                            t = torch.full((20000 + k,), float(k * 1000 + v))
                            vals[(k, v)] = t
                            f = sw.swap_out(k, t, async_op=True)
                        mine[k] = v
                        if rng.random() < 0.5:
                            f.result()
                    elif op < 0.7:
                        o = torch.empty(20000 + k)
                        sw.swap_in(k, out=o)
                        v = version_of(k, o)
                        assert v is not None, "torn read of key %d" % k
                        assert v >= mine.get(k, 0), "read older than own write"
                    else:
                        sw.prefetch([k])
                        o = torch.empty(20000 + k)
                        sw.swap_in(k, out=o)
                        assert version_of(k, o) is not None
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
        # prefetches make keys resident; one thread releases them now and then
        stop = threading.Event()

        def releaser():
            rng = random.Random(99)
            while not stop.is_set():
                sw.release(rng.randrange(n_keys))
        ts = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        rl = threading.Thread(target=releaser)
        for t in ts + [rl]:
            t.start()
        for t in ts:
            t.join(60)
        stop.set()
        rl.join(10)
        assert not errors, errors[0]
        sw.wait()
        for k in range(n_keys):
            o = torch.empty(20000 + k)
            sw.swap_in(k, out=o)
            assert version_of(k, o) == last[k], k


def test_pool_bounds(engine, dirs):
    with Swapper(dirs[:1], 64 << 10, engine=engine) as sw:
        sw.swap_out("a", torch.zeros(10000))              # 40000 bytes: fits
        t = sw.swap_in("a")
        with pytest.raises(MemoryError, match="'a'"):     # held by a: says so
            sw.buffer(40000)
        sw.release("a")
        sw.buffer(40000)                                   # now it fits
        sw.swap_out("big", torch.ones(100000))             # bigger than the pool: direct
        with pytest.raises(ValueError, match="pool_bytes >= 401408"):
            sw.swap_in("big")                              # no out: needs the pool
        with pytest.raises(ValueError, match="pool_bytes >= 401408"):
            sw.swap_out("nc", torch.ones(200, 500).t())    # not contiguous and too big
        o = torch.empty(100000)
        sw.swap_in("big", out=o)
        assert torch.equal(o, torch.ones(100000))
        del t
    with Swapper(dirs[:1], 0, engine=engine) as sw:       # no pool at all: direct only
        sw.swap_out("x", torch.arange(5000))
        o = torch.empty(5000, dtype=torch.int64)
        assert torch.equal(sw.swap_in("x", out=o), torch.arange(5000))


def test_pool_memory_is_the_bound(engine, dirs):
    """Many async swap-outs through a small pool: they wait for room rather than
    grow; the pool is all the memory the swapper holds."""
    with Swapper(dirs, 256 << 10, engine=engine) as sw:
        futs = [sw.swap_out(i, torch.full((30000,), float(i)), async_op=True)
                for i in range(64)]
        sw.wait()
        assert [f.result() for f in futs] == list(range(64))
        assert sw._pool_ext.used == 0
        got = sw.prefetch(range(2))
        assert torch.equal(got[1].result(), torch.full((30000,), 1.0))
        assert sw._pool_ext.used == 2 * 122880


def test_striping_by_bandwidth_and_capacity(engine, dirs):
    with Swapper(dirs, 4 << 20, engine=engine, bandwidth=[3, 1]) as sw:
        for i in range(8):
            sw.swap_out(i, torch.full((1 << 20,), float(i)))  # 4 MiB each: split 3:1
        a, b = sw.bytes_on_disk
        assert a == 3 * b, (a, b)
        for i in range(8):
            sw.swap_out(("s", i), torch.full((1000,), float(i)))  # small: whole, weighted
        for i in range(8):
            assert torch.equal(sw.swap_in(i, out=torch.empty(1 << 20)),
                               torch.full((1 << 20,), float(i)))
    cap = [1 << 20, 64 << 20]
    with Swapper(dirs, 4 << 20, engine=engine, capacity=cap) as sw:
        for i in range(4):
            sw.swap_out(i, torch.full((1 << 20,), float(i)))
        assert sw.bytes_on_disk[0] <= cap[0]
        assert sum(sw.bytes_on_disk) == 4 * (4 << 20)
        for i in range(4):
            assert torch.equal(sw.swap_in(i, out=torch.empty(1 << 20)),
                               torch.full((1 << 20,), float(i)))


def test_full_disk_keeps_previous_value(engine, dirs):
    with Swapper(dirs[:1], 1 << 20, engine=engine, capacity=[100 << 10]) as sw:
        sw.swap_out("k", torch.full((10000,), 1.0))          # 40 KiB
        with pytest.raises(SwapError) as ei:
            sw.swap_out("k", torch.full((20000,), 2.0))      # old + new do not fit
        assert ei.value.errno == errno.ENOSPC and ei.value.key == "k"
        assert dirs[0] in str(ei.value)
        assert torch.equal(sw.swap_in("k", out=torch.empty(10000)), torch.full((10000,), 1.0))
        sw.swap_out("k", torch.full((10000,), 3.0))          # still usable
        assert torch.equal(sw.swap_in("k", out=torch.empty(10000)), torch.full((10000,), 3.0))


def test_bad_input(engine, tmp_path, dirs):
    with pytest.raises(SwapError) as ei:
        Swapper([str(tmp_path / "missing")], 0, engine=engine)
    assert ei.value.errno == errno.ENOENT and "missing" in str(ei.value)
    f = tmp_path / "file"
    f.write_bytes(b"x")
    with pytest.raises(SwapError) as ei:
        Swapper([str(f)], 0, engine=engine)
    assert ei.value.errno == errno.ENOTDIR
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(SwapError, match="not writable"):
            Swapper([str(ro)], 0, engine=engine)
    with Swapper(dirs, 1 << 20, engine=engine) as sw:
        with pytest.raises(KeyError, match="'nope' was never swapped out"):
            sw.swap_in("nope")
        with pytest.raises(TypeError):
            sw.swap_out("x", [1, 2])
        sw.swap_out("x", torch.zeros(100))
        with pytest.raises(ValueError, match="float32"):
            sw.swap_in("x", out=torch.zeros(100, dtype=torch.float64))
        # a swap file truncated behind the swapper's back: an error, not zeros
        for fl in sw.files:
            os.ftruncate(fl.fd, 0)
        with pytest.raises(SwapError) as ei:
            sw.swap_in("x", out=torch.empty(100))
        assert ei.value.key == "x" and ei.value.errno == errno.ENODATA
        assert ".nvio-swap-" in str(ei.value)
        with pytest.raises(SwapError):
            sw.swap_in("x")
        sw.swap_out("x", torch.ones(100))                     # usable again
        assert torch.equal(sw.swap_in("x"), torch.ones(100))
    with pytest.raises(ValueError, match="closed"):
        sw.swap_in("x")


def test_files_removed_on_close_and_exit(engine, dirs):
    sw = Swapper(dirs, 1 << 20, engine=engine)
    sw.swap_out("x", torch.zeros(1 << 20))
    assert os.listdir(dirs[0]) == [] and os.listdir(dirs[1]) == []   # unlinked at open
    fds = [f.fd for f in sw.files]
    assert all(os.readlink("/proc/self/fd/%d" % fd).endswith("(deleted)") for fd in fds)
    sw.close()
    sw.close()


def test_files_removed_after_sigkill(dirs):
    """A process killed with swap files open leaves nothing (the engine does
    not matter here: the files are unlinked at open)."""
    code = ("import sys, os, signal, torch, nvio.offload as o\n"
            "sw = o.Swapper(sys.argv[1:], 1 << 20)\n"
            "sw.swap_out('x', torch.zeros(1 << 18))\n"
            "print('ready', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code] + dirs, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == -signal.SIGKILL and "ready" in r.stdout, r.stderr
    assert os.listdir(dirs[0]) == [] and os.listdir(dirs[1]) == []


def test_checkpoint_and_restore(engine, dirs, tmp_path):
    g = torch.Generator().manual_seed(4)
    want = {("layer", i): rand(1000 * i + 7, DTYPES[i % len(DTYPES)], g) for i in range(12)}
    want["e"] = torch.empty(0, 3)
    with Swapper(dirs, 256 << 10, engine=engine, stripe_min=8 << 10) as sw:
        for k, t in want.items():
            sw.swap_out(k, t)
        sw.swap_out(("layer", 3), torch.zeros(5))         # replaced: the new value counts
        want[("layer", 3)] = torch.zeros(5)
        ck = tmp_path / "ck"
        assert sw.checkpoint(str(ck)) == len(want)
    with Swapper.restore(str(ck), dirs[1:], 64 << 10, engine=engine) as sw2:
        assert set(sw2.keys()) == set(want)
        for k, t in want.items():
            assert same(sw2.swap_in(k, out=torch.empty_like(t)), t), k
    with open(ck / "index.json") as fp:
        idx = json.load(fp)
    os.truncate(ck / "data.bin", idx["keys"][-2]["offset"])
    with pytest.raises(SwapError, match="truncated"):
        Swapper.restore(str(ck), dirs[1:], 64 << 10, engine=engine)
    with pytest.raises(SwapError, match="no swapper checkpoint"):
        Swapper.restore(str(tmp_path), dirs[1:], engine=engine)




FAULTS = r"""
import ctypes, errno, json, sys, torch
import nvio.offload as o
lib = ctypes.CDLL(None)
lib.nvio_fault_arm.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_int, ctypes.c_char_p]
d = sys.argv[1]
out = []
for direct in sys.argv[2:]:
  sw = o.Swapper([d], 1 << 20, engine="psync", direct=direct == "1", block_size=64 << 10)
  for name in ("pwrite", "pwritev", "fallocate", "pread", "preadv"):
    for nth in (1, 3):
        for e in ((errno.EIO, errno.ENOSPC) if name in ("pwrite", "fallocate") else
                  (errno.EIO,)):
            sw.swap_out("k", torch.full((50000,), 1.0))
            lib.nvio_fault_arm(name.encode(), nth, e, d.encode())
            raised = None
            try:
                sw.swap_out("k", torch.full((50000,), 2.0))
                v = sw.swap_in("k", out=torch.empty(50000))
            except OSError as x:
                raised = x
            fired = lib.nvio_fault_fired()
            lib.nvio_fault_arm(b"", 0, 0, None)
            o2 = torch.empty(50000)
            sw.swap_in("k", out=o2)          # the swapper is still usable
            out.append({"call": name, "nth": nth, "err": e, "fired": fired,
                        "raised": None if raised is None else raised.errno,
                        "key": getattr(raised, "key", None),
                        "value": float(o2[0]) if torch.all(o2 == o2[0]) else None})
  sw.close()
print(json.dumps(out))
"""


def test_injected_faults(preload, tmp_path):
    """EIO/ENOSPC at the n-th pwrite, pwritev, fallocate, pread, preadv (psync
    engine, buffered and O_DIRECT): the error names the key, a failed write
    keeps the old value, and the swapper goes on working."""
    modes = ["0"] + (["1"] if nvio.probe(str(tmp_path))["direct_ok"] else [])
    env = dict(os.environ, LD_PRELOAD=preload)
    r = subprocess.run([sys.executable, "-c", FAULTS, str(tmp_path)] + modes,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    cases = json.loads(r.stdout.strip().splitlines()[-1])
    assert any(c["fired"] for c in cases)
    for c in cases:
        if c["fired"]:
            assert c["raised"] == c["err"] and c["key"] == "k", c
            # a failed write left the old value, a failed read the new one
            assert c["value"] == (1.0 if c["call"] in ("pwrite", "pwritev", "fallocate")
                                  else 2.0), c
        else:
            assert c["raised"] is None and c["value"] == 2.0, c
