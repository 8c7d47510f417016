"""nvio.data without megatron: flat token files (nanoGPT raw, llm.c
headered), batches equal to sample-by-sample reads on every engine and
direct mode, the lane plan, BatchLoader (prefetch, samplers, held batches),
torch's DataLoader with 0 and 2 workers (fork and spawn), a read that fails
(injected EIO, a file cut short under the reader), bad headers, and batches
landing in device memory (the CUDA/cuFile simulator)."""
import errno
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nvio  # noqa: E402
import nvio.data as nd  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def tokens_file(path, n, dtype=np.uint16, header=None, seed=0):
    """n random tokens, raw or behind an llm.c header (magic, version)."""
    toks = np.random.default_rng(seed).integers(0, np.iinfo(np.uint16).max, n).astype(dtype)
    with open(path, "wb") as f:
        if header is not None:
            h = np.zeros(256, "<i4")
            h[0], h[1], h[2] = header[0], header[1], n
            f.write(h.tobytes())
        f.write(toks.tobytes())
    return toks


def test_import_is_light():
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, nvio, nvio.data
        print(sorted(m for m in ("torch", "torch.utils.data", "megatron") if m in sys.modules))
        """)], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=os.path.dirname(nvio.__path__[0])))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@pytest.mark.parametrize("kind", ["raw16", "raw32", "llmc16", "llmc32"])
def test_token_windows_equal_the_file(kind, engine, direct, tmp_path):
    p = str(tmp_path / "t.bin")
    dt = np.uint32 if kind.endswith("32") else np.uint16
    header = {"llmc16": (20240520, 1), "llmc32": (20240801, 7)}.get(kind)
    toks = tokens_file(p, 50_000 + 3, dt, header)
    kw = {} if header else {"dtype": dt}
    ds = nd.TokenWindows(p, 127, engine=engine, direct=direct, **kw)
    assert (ds.dtype, ds.ntokens, ds.header, len(ds)) == \
        (np.dtype(dt), len(toks), 1024 if header else 0, len(toks) - 127)
    rng = np.random.default_rng(1)
    # random starts, neighbours that overlap (a lane each), a duplicate, the ends
    idx = list(rng.integers(0, len(ds), 200)) + [5, 6, 7, 7, 0, len(ds) - 1, -1]
    got = ds.read_batch(idx)
    assert got.shape == (len(idx), 128) and got.dtype == nd._buffers.torch_dtype(dt)
    want = np.stack([toks[i:i + 128] for i in (int(i) % len(ds) for i in idx)])
    assert got.numpy().tobytes() == want.tobytes()
    for i in idx[:20] + [len(ds) - 1]:
        assert ds[i].numpy().tobytes() == toks[int(i) % len(ds):int(i) % len(ds) + 128].tobytes()
    # stride: windows at multiples of it
    s = nd.TokenWindows(p, 63, stride=64, engine=engine, direct=direct, **kw)
    assert len(s) == (len(toks) - 64) // 64 + 1
    assert s.read_batch([3])[0].numpy().tobytes() == toks[192:256].tobytes()


def test_pool_keeps_a_dropped_buffer_until_the_cuda_stream_passes(monkeypatch):
    """A batch copied with .to("cuda", non_blocking=True) and dropped: its
    buffer is not reused until an event recorded on the current stream once
    it was found dropped has passed. torch here has no CUDA (nor has the
    simulator a torch), so torch.cuda is faked: is_initialized, Event."""
    import torch
    from nvio.data._loader import _Pool
    events = []

    class Event:
        def __init__(self):
            self.done = False
            self.recorded = False
            events.append(self)

        def record(self):
            self.recorded = True

        def query(self):
            return self.done

    pool = _Pool()
    b = pool.take(4096)
    first = id(b)
    del b
    held = pool.take(4096)                       # no CUDA in use: reused at once
    assert id(held) == first
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    assert not events
    del held                                     # the caller copies it non_blocking, drops it
    other = pool.take(4096)
    assert id(other) != first                    # the copy may still run: not reused
    assert len(events) == 1 and events[0].recorded
    assert id(pool.take(4096)) != first and len(events) == 1    # same event, still pending
    events[0].done = True
    again = pool.take(4096)
    assert id(again) == first and first not in pool.fences
    # trimming never frees a buffer whose copy may still run
    del again
    bufs = [pool.take(4096) for _ in range(20)]
    assert any(id(x) == first for x in pool.free)
    del bufs


def test_non_integer_indices_are_refused(tmp_path):
    """3.0 was read as window 3 (int(3.0) == 3.0); NumPy refuses a float
    index, so nvio.data does: SampleTypeError, a TypeError and an
    IndexError, naming the file; bools too (NumPy takes them for masks)."""
    import torch
    p = str(tmp_path / "t.bin")
    toks = tokens_file(p, 1000)
    ds = nd.TokenWindows(p, 15)
    for bad in (3.0, np.float64(3), np.float32(2), True, np.True_, "3", None, 2.5,
                torch.tensor(3.0)):
        for read in (lambda: ds[bad], lambda: ds.read_batch([1, bad]),
                     lambda: ds.__getitems__([bad])):
            with pytest.raises(nd.SampleTypeError, match=r"t.bin: sample index .* is no "
                                                         r"integer") as e:
                read()
            assert isinstance(e.value, TypeError) and isinstance(e.value, IndexError)
            assert e.value.path == p
    for good in (3, np.int64(3), np.uint8(3), torch.tensor(3), np.array(3)):
        assert ds[good].numpy().tobytes() == toks[3:19].tobytes()
        assert ds.read_batch([good])[0].numpy().tobytes() == toks[3:19].tobytes()


def test_batch_is_one_submission_into_one_locked_buffer(tmp_path, monkeypatch):
    p = str(tmp_path / "t.bin")
    tokens_file(p, 100_000)
    ds = nd.TokenWindows(p, 255, engine="psync")
    ds.read_batch([0])
    calls = []
    comp = nvio.completions(ds.source.handle)
    real = comp.submit
    monkeypatch.setattr(comp, "submit", lambda ops, **k: calls.append(list(ops)) or real(ops, **k))
    idx = np.random.default_rng(2).permutation(len(ds) // 256)[:256] * 256
    b = ds.read_batch(idx)
    assert len(calls) == 1 and len(calls[0]) == 1       # one submit, one op (disjoint: one lane)
    op = calls[0][0]
    assert op[3] == nvio.OFFSET_PER_IOV and len(op[2]) == 256
    offs = [o for _, o in op[2]]
    assert offs == sorted(offs)
    buf = b.untyped_storage()
    assert buf.nbytes() >= 256 * 512 and b.is_contiguous()
    assert nvio.buffer_info(b)[0] == buf.data_ptr()
    assert nvio._nvio.mem_query(buf.data_ptr(), buf.nbytes()) & nvio._nvio.MEM_NVIO


def test_plan_lanes():
    rng = np.random.default_rng(3)
    for trial in range(200):
        n = int(rng.integers(0, 40))
        offs = rng.integers(0, 500, n)
        sizes = rng.integers(0, 60, n)
        lanes = nd.plan_lanes(offs, sizes)
        got = sorted(i for lane in lanes for i in lane)
        assert got == [i for i in range(n) if sizes[i] > 0]
        for lane in lanes:
            for a, b in zip(lane, lane[1:]):
                assert offs[a] + sizes[a] <= offs[b]
        # disjoint ranges: one lane
    assert nd.plan_lanes([30, 0, 10], [10, 10, 20]) == [[1, 2, 0]]
    assert nd.plan_lanes([0, 5], [10, 10]) == [[0], [1]]


def test_plan_reads_aligned_one_request_per_sample():
    """O_DIRECT plans: every read a whole number of aligned blocks (the
    last may stop at the file's end) at an aligned place in the buffer, in
    file order without overlap (one lane); each sample inside its read;
    filling the buffer by the plan gives every sample's bytes."""
    rng = np.random.default_rng(4)
    size = 1_000_003
    data = rng.integers(0, 256, size, dtype=np.uint8)
    for trial in range(300):
        al = int(rng.choice([512, 4096, 8192]))
        n = int(rng.integers(0, 50))
        nb = rng.integers(0, 20_000, n)
        offs = np.minimum(rng.integers(0, size, n), size - nb)
        if trial % 3 == 0 and n:
            offs[: n // 2] = offs[0] + np.arange(n // 2) * 3     # neighbours, duplicates
            offs = np.minimum(offs, size - nb)
        p = nd.plan_reads(offs, nb, al, size)
        assert len(p.lanes) <= 1 and (len(p.lanes) == 1) == bool((nb > 0).any())
        buf = np.zeros(p.total, np.uint8)
        for ro, rl, rp, members, member_read in p.lanes:
            assert (ro % al == 0).all() and (rp % al == 0).all()
            assert ((rl % al == 0) | (ro + rl == size)).all() and (rl > 0).all()
            assert (ro[1:] >= ro[:-1] + rl[:-1]).all()
            assert sorted(members.tolist()) == [i for i in range(n) if nb[i] > 0]
            for o, ln, at in zip(ro, rl, rp):
                buf[at:at + ln] = data[o:o + ln]
            g = member_read
            assert (ro[g] <= offs[members]).all() and \
                (offs[members] + nb[members] <= ro[g] + rl[g]).all()
        for i in range(n):
            assert buf[p.pos[i]:p.pos[i] + nb[i]].tobytes() == \
                data[offs[i]:offs[i] + nb[i]].tobytes()
    # align 1: the exact ranges, packed in sample order
    p = nd.plan_reads([30, 0, 10], [10, 10, 20], 1, 100)
    assert p.compact and p.total == 40 and p.pos.tolist() == [0, 10, 20]
    assert [m.tolist() for _, _, _, m, _ in p.lanes] == [[1, 2, 0]]
    # 8,196-byte samples at 4 KiB: three blocks each, neighbours merged
    p = nd.plan_reads([8196, 0, 100_000], [8196, 8196, 8196], 4096, 200_000)
    ro, rl, rp, _, _ = p.lanes[0]
    assert ro.tolist() == [0, 98304] and rl.tolist() == [20480, 12288]
    assert p.pos.tolist() == [8196, 0, 20480 + 100_000 - 98304]


def test_direct_batches_are_aligned_reads_past_the_page_cache(tmp_path, engine, monkeypatch):
    """With O_DIRECT a batch of unaligned samples is one aligned request per
    sample straight into the buffer: no piece of it is unaligned (libnvio
    would read an unaligned head and tail through the page cache), and
    the file's pages stay out of the cache. Aligned as the file system
    takes it: to sectors where it reads 512-byte offsets, so a sample of
    8196 bytes costs 8.5 or 9 KiB, not the 12 KiB of its pages."""
    d = tmp_path / "data"
    d.mkdir()
    if not nvio.probe(str(d))["direct_ok"]:
        pytest.skip("O_DIRECT not supported in %s" % d)
    p = str(d / "t.bin")
    toks = tokens_file(p, 2_000_000, np.uint16)
    with open(p, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    from nvio.data._read import cached_bytes
    if cached_bytes(p) > 0:
        pytest.skip("the page cache keeps %s after POSIX_FADV_DONTNEED" % p)
    ds = nd.TokenWindows(p, 4097, dtype=np.uint16, header=0, engine=engine, direct=True)
    calls = []
    comp = nvio.completions(ds.source.handle)
    real = comp.submit
    monkeypatch.setattr(comp, "submit", lambda ops, **k: calls.append(list(ops)) or real(ops, **k))
    idx = np.random.default_rng(7).integers(0, len(ds) - 8192, 64).tolist()
    got = ds.read_batch(idx)
    want = np.stack([toks[i:i + 4098] for i in idx])
    assert got.numpy().tobytes() == want.tobytes()
    pieces = [(nvio.buffer_info(b), off) for op in calls[0] for b, off in op[2]]
    assert 0 < len(pieces) <= len(idx) and len(calls) == 1
    info = ds.source.file().info()
    a = ds.source.align()
    assert a == max(512, info["dio_offset_align"], info["dio_mem_align"])
    for (addr, n), off in pieces:
        assert off % a == 0 and addr % a == 0 and n % a == 0, (addr, n, off, a)
    # no more than each sample's covering aligned range
    span = sum((i * 2 + 8196 + a - 1) // a * a - i * 2 // a * a for i in idx)
    assert sum(n for (_, n), _ in pieces) <= span
    assert cached_bytes(p) == 0
    # the last window ends with the file, off the block grid: its last
    # block is read through the page cache (O_DIRECT reads whole blocks)
    got = ds.read_batch([len(ds) - 1, 0])
    assert got.numpy().tobytes() == np.stack([toks[-4098:], toks[:4098]]).tobytes()


def test_header_and_index_errors(tmp_path):
    p = str(tmp_path / "t.bin")
    tokens_file(p, 1000, np.uint16, (20240520, 1))
    os.truncate(p, 1024 + 999 * 2)
    with pytest.raises(nd.DataTruncatedError, match="t.bin: truncated: 3022 bytes, its header "
                                                    "says 1000 tokens of uint16"):
        nd.TokenWindows(p, 10)
    with pytest.raises(nd.DataFormatError, match="holds uint16 tokens, not uint32"):
        nd.TokenWindows(p, 10, dtype=np.uint32)
    with open(p, "wb") as f:
        f.write(b"\x01" * 7)
    with pytest.raises(nd.DataTruncatedError, match="no whole number of uint16"):
        nd.TokenWindows(p, 1, header=0)
    with pytest.raises(nd.DataFormatError, match="no llm.c token file"):
        nd.TokenWindows(p, 1, header="llm.c")
    tokens_file(p, 100)
    with pytest.raises(nd.DataFormatError, match="100 tokens, fewer than one window of 101"):
        nd.TokenWindows(p, 100)
    ds = nd.TokenWindows(p, 10, dtype=np.uint16)
    for bad in (len(ds), -len(ds) - 1, 10**12):
        with pytest.raises(nd.SampleIndexError, match=r"t.bin: sample %d out of range: the "
                                                      r"dataset has 90 samples" % bad) as e:
            ds.read_batch([0, bad])
        assert isinstance(e.value, IndexError) and e.value.sample == bad
        with pytest.raises(nd.SampleIndexError, match=r"sample %d out of range" % bad):
            ds.read_batch(np.array([0, bad], np.int64))     # a batch checked at once
        with pytest.raises(IndexError):
            ds[bad]
    with pytest.raises(nd.SampleIndexError, match=r"sample %d out of range" % (2**64 - 1)):
        ds.read_batch(np.array([2**64 - 1], np.uint64))     # not -1 as an int64
    assert ds.read_batch(np.array([-1, 0], np.int32)).numpy().tobytes() == \
        np.stack([ds[89].numpy(), ds[0].numpy()]).tobytes()
    with pytest.raises(TypeError):
        ds["x"]


def test_read_faults_name_the_file_and_samples(tmp_path, engine, direct):
    """A .bin cut short under an open reader (on every engine): the batch
    fails naming the file, the samples and their bytes; never garbage."""
    p = str(tmp_path / "t.bin")
    tokens_file(p, 100_000)
    ds = nd.TokenWindows(p, 1023, engine=engine, direct=direct)
    ds.read_batch([0])                                  # the handle is open
    os.truncate(p, 100_000)                             # half the tokens
    with pytest.raises(nd.DataReadError) as e:
        ds.read_batch([10, 90_000, 20])
    msg = str(e.value)
    assert p in msg and "sample 90000 (bytes 180000..182048)" in msg, msg
    assert e.value.sample == 90000 and e.value.offset == 180000 and e.value.nbytes == 2048
    assert e.value.path == p and isinstance(e.value.__cause__, nvio.NvioError)
    with pytest.raises(nd.DataReadError, match="sample 49900 "):
        ds[49_900]
    assert ds.read_batch([1]).shape == (1, 1024)        # the part still there reads


SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>
static long nth = -1, calls;
static char dir[4096];
void data_fault_arm(long n, const char *under)
{
	nth = n;
	calls = 0;
	snprintf(dir, sizeof(dir), "%s", under);
}
static int hit(int fd)
{
	char link[64], target[4096];
	ssize_t n;
	if (nth < 0)
		return 0;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n < 0)
		return 0;
	target[n] = 0;
	if (strncmp(target, dir, strlen(dir)))
		return 0;
	return __atomic_add_fetch(&calls, 1, __ATOMIC_SEQ_CST) == nth;
}
ssize_t pread(int fd, void *b, size_t n, off_t off)
{
	static ssize_t (*real)(int, void *, size_t, off_t);
	if (!real) real = dlsym(RTLD_NEXT, "pread");
	if (hit(fd)) { errno = EIO; return -1; }
	return real(fd, b, n, off);
}
ssize_t pread64(int fd, void *b, size_t n, off_t off) { return pread(fd, b, n, off); }
ssize_t preadv(int fd, const struct iovec *v, int c, off_t off)
{
	static ssize_t (*real)(int, const struct iovec *, int, off_t);
	if (!real) real = dlsym(RTLD_NEXT, "preadv");
	if (hit(fd)) { errno = EIO; return -1; }
	return real(fd, v, c, off);
}
ssize_t preadv64(int fd, const struct iovec *v, int c, off_t off) { return preadv(fd, v, c, off); }
"""

FAULT = r"""
import ctypes, json, sys
import numpy as np
import nvio.data as nd
lib = ctypes.CDLL(None)
lib.data_fault_arm.argtypes = [ctypes.c_long, ctypes.c_char_p]
p, d = sys.argv[1], sys.argv[2]
want = np.fromfile(p, np.uint16)
idx = [7000, 100, 40000, 25000]
out = {}
for m in sys.argv[3:]:
  ds = nd.TokenWindows(p, 511, engine="psync", direct=m == "1")
  out[m] = res = []
  for nth in (1, 2, 4):
    lib.data_fault_arm(nth, d.encode())
    try:
        ds.read_batch(idx)
        res.append({"nth": nth, "raised": None})
    except nd.DataReadError as e:
        res.append({"nth": nth, "raised": e.errno, "msg": str(e), "sample": e.sample,
                    "offset": e.offset})
    lib.data_fault_arm(-1, b"")
    got = ds.read_batch(idx).numpy()
    res[-1]["after"] = all(got[k].tobytes() == want[i:i + 512].tobytes() for k, i in enumerate(idx))
print(json.dumps(out))
"""


def test_injected_read_faults(tmp_path):
    """EIO at the n-th pread/preadv of the .bin (psync: the engine whose reads
    go through libc, an LD_PRELOAD shim), buffered and O_DIRECT: DataReadError
    with errno EIO naming the file and a sample of the batch; the next batch
    reads whole."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler for the fault shim")
    src, so = tmp_path / "shim.c", tmp_path / "shim.so"
    src.write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(so), str(src), "-ldl"], check=True)
    d = tmp_path / "data"
    d.mkdir()
    p = str(d / "t.bin")
    tokens_file(p, 50_000)
    modes = ["0"] + (["1"] if nvio.probe(str(d))["direct_ok"] else [])
    r = subprocess.run([sys.executable, "-c", FAULT, p, str(d)] + modes, capture_output=True,
                       text=True, timeout=120,
                       env=dict(os.environ, LD_PRELOAD=str(so),
                                PYTHONPATH=os.path.dirname(nvio.__path__[0])))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert sorted(out) == modes
    starts = {7000: 14000, 100: 200, 40000: 80000, 25000: 50000}
    for m, cases in out.items():
        assert cases[0]["raised"] == errno.EIO, (m, cases)
        for c in cases:
            assert c["after"], (m, c)
            if c["raised"] is not None:
                assert c["raised"] == errno.EIO and p in c["msg"], c
                assert c["sample"] in starts and c["offset"] == starts[c["sample"]], c
                assert "sample %d (bytes %d..%d)" % (c["sample"], c["offset"],
                                                     c["offset"] + 1024) in c["msg"], c


# --- loaders -------------------------------------------------------------------


def test_batch_loader_prefetch_samplers_and_held_batches(tmp_path, engine):
    p = str(tmp_path / "t.bin")
    toks = tokens_file(p, 200_000)
    ds = nd.TokenWindows(p, 63, engine=engine)
    want = lambda idx: np.stack([toks[i:i + 64] for i in idx])
    g = torch.Generator().manual_seed(4)
    sampler = torch.utils.data.RandomSampler(ds, num_samples=64 * 20, generator=g)
    order = list(torch.utils.data.BatchSampler(
        torch.utils.data.RandomSampler(ds, num_samples=64 * 20,
                                       generator=torch.Generator().manual_seed(4)), 64, False))
    held = []
    loader = nd.BatchLoader(ds, batch_size=64, sampler=sampler, prefetch=3)
    assert len(loader) == 20
    for k, b in enumerate(loader):
        assert b.shape == (64, 64) and b.numpy().tobytes() == want(order[k]).tobytes(), k
        if k % 3 == 0:
            held.append((k, b))         # kept: its buffer must not be reused
    for k, b in held:
        assert b.numpy().tobytes() == want(order[k]).tobytes(), k
    # DistributedSampler: each rank reads its share; together every sample once
    seen = []
    for rank in range(2):
        s = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=2, rank=rank,
                                                            shuffle=True, seed=9)
        s.set_epoch(1)
        idx = list(s)[:300]
        got = torch.cat(list(nd.BatchLoader(ds, batch_size=50, sampler=idx, prefetch=2)))
        assert got.numpy().tobytes() == want(idx).tobytes()
        seen += idx
    assert len(set(seen)) == len(seen)
    assert list(nd.BatchLoader(ds, batch_size=7, sampler=[], prefetch=0)) == []


def _check_loader(ds, toks, workers, ctx):
    order = list(torch.utils.data.BatchSampler(
        torch.utils.data.RandomSampler(ds, num_samples=32 * 6,
                                       generator=torch.Generator().manual_seed(5)), 32, False))
    dl = torch.utils.data.DataLoader(ds, batch_sampler=order, num_workers=workers,
                                     collate_fn=nd.collate, multiprocessing_context=ctx,
                                     timeout=120 if workers else 0)
    n = 0
    for k, b in enumerate(dl):
        assert b.shape == (32, 64)
        assert b.numpy().tobytes() == np.stack([toks[i:i + 64] for i in order[k]]).tobytes()
        if workers:
            assert b.is_shared()        # read into shared memory in the worker, not copied
        n += 1
    assert n == 6


@pytest.mark.parametrize("workers,ctx", [(0, None), (2, "fork"), (2, "spawn")])
def test_dataloader_workers(tmp_path, workers, ctx):
    """torch's DataLoader calls __getitems__ with each batch's indices: one
    vectored read per batch, in the main process or in each worker on its
    own handle (the parent's is open before the fork)."""
    p = str(tmp_path / "t.bin")
    toks = tokens_file(p, 100_000)
    ds = nd.TokenWindows(p, 63, engine="io_uring" if nvio.engine_available("io_uring")[0]
                         else "psync")
    ds.read_batch([0])
    parent = ds.source.handle
    _check_loader(ds, toks, workers, ctx)
    assert ds.source.handle is parent
    # default collate: stacked copies, the same values
    dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=0)
    b = next(iter(dl))
    assert b.shape == (4, 64) and b.numpy().tobytes() == np.stack(
        [toks[i:i + 64] for i in range(4)]).tobytes()


def _fds_to(path):
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + fd) == path:
                out.append(int(fd))
        except OSError:
            pass
    return sorted(out)


class _FdProbe(torch.utils.data.Dataset):
    """In a worker: the descriptors of ds's file before and after its first
    read there."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return 1

    def __getitem__(self, i):
        before = _fds_to(self.ds.source.path)
        self.ds.read_batch([0])
        return json.dumps([before, _fds_to(self.ds.source.path)])


def test_forked_worker_drops_the_inherited_descriptors(tmp_path):
    """A worker forked after the main process opened the dataset shares its
    open file (and shared flock) only until its first read: its own handle
    replaces the parent's, whose inherited descriptors are closed, so a
    worker never holds the parent's lock after the parent closes."""
    if sys.platform != "linux":
        pytest.skip("/proc/self/fd")
    p = str(tmp_path / "t.bin")
    tokens_file(p, 10_000)
    ds = nd.TokenWindows(p, 63)
    ds.read_batch([0])
    mine = _fds_to(p)
    assert mine
    dl = torch.utils.data.DataLoader(_FdProbe(ds), batch_size=None, num_workers=1,
                                     multiprocessing_context="fork")
    before, after = json.loads(next(iter(dl)))
    assert before == mine                   # inherited: the parent's descriptors
    assert after and not set(after) & set(before), (before, after)


def test_pickle_reopens(tmp_path):
    p = str(tmp_path / "t.bin")
    toks = tokens_file(p, 10_000)
    ds = nd.TokenWindows(p, 9, engine="psync", direct=False)
    ds.read_batch([1])
    c = pickle.loads(pickle.dumps(ds))
    assert c.source._handle is None and c.direct is False
    assert c.read_batch([3])[0].numpy().tobytes() == toks[3:13].tobytes()
    assert c.source.handle is not ds.source.handle
    ds.close()
    c.close()


def test_direct_auto_decides(tmp_path, monkeypatch):
    p = str(tmp_path / "t.bin")
    tokens_file(p, 1 << 20)
    import nvio.data._read as r
    monkeypatch.setattr(r, "_cgroup_room", lambda: (100 << 20, "memory.limit_in_bytes"))
    monkeypatch.setattr(r, "cached_bytes", lambda path: 0)
    use, why = nd.choose_direct("auto", [(p, 10 << 30)])
    assert use and why.startswith("O_DIRECT: 10.00 GiB to read") and "exceed" in why
    use, why = nd.choose_direct("auto", [(p, 1 << 20)])
    assert use        # 1 MiB + the 256 MiB margin > 100 MiB of cgroup room
    monkeypatch.setattr(r, "_cgroup_room", lambda: (None, "no memory cgroup limit"))
    use, why = nd.choose_direct("auto", [(p, 1 << 20)])
    assert not use and why.startswith("page cache")
    # what is cached counts as room (the cgroup's usage holds it)
    monkeypatch.setattr(r, "_cgroup_room", lambda: (100 << 20, "memory.limit_in_bytes"))
    monkeypatch.setattr(r, "cached_bytes", lambda path: 1 << 30)
    assert not nd.choose_direct("auto", [(p, 1 << 30)])[0]
    assert nd.choose_direct(True, [])[0] and not nd.choose_direct(False, [])[0]
    with pytest.raises(ValueError):
        nd.choose_direct("maybe", [])
    # fits, but cold: O_DIRECT (a cold start through the page cache pays a
    # fault or a buffered read per sample and readahead); warm: page cache
    monkeypatch.setattr(r, "_cgroup_room", lambda: (None, "no memory cgroup limit"))
    monkeypatch.setattr(r, "_meminfo_available", lambda: 64 << 30)
    monkeypatch.setattr(r, "cached_bytes", lambda path: 0)
    use, why = nd.choose_direct("auto", [(p, 4 << 30)])
    assert use and why.startswith("O_DIRECT") and "cold" in why and "fit in" in why
    monkeypatch.setattr(r, "cached_bytes", lambda path: (4 << 30) - (300 << 20))
    use, why = nd.choose_direct("auto", [(p, 4 << 30)])
    assert not use and why.startswith("page cache") and "warm" in why
    monkeypatch.setattr(r, "cached_bytes", lambda path: 2 << 30)
    assert nd.choose_direct("auto", [(p, 4 << 30)])[0]
    ds = nd.TokenWindows(p, 9)
    assert ds.direct_why and ds.source.direct == ds.direct


def test_a_fifo_or_directory_in_place_of_a_data_file_is_an_error_not_a_hang(tmp_path):
    """open(2) of a FIFO waits for a writer: a dataset must refuse it at
    once, naming it, for a token file, a Megatron .idx and its .bin."""
    import threading
    p = str(tmp_path / "t.bin")
    tokens_file(p, 1000)
    idx = tmp_path / "m.idx"           # a valid index of one empty sequence
    idx.write_bytes(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, 1, 2) +
                    struct.pack("<iqqq", 0, 0, 0, 1))
    cases = []
    for name, make in (("fifo.bin", lambda q: nd.TokenWindows(q, 8)),
                       ("n.idx", lambda q: nd.IndexedDataset(q[:-4])),
                       ("m.bin", lambda q: nd.IndexedDataset(q[:-4]))):
        q = str(tmp_path / name)
        os.mkfifo(q)
        cases.append((q, make, "is a FIFO, not a regular file"))
    os.mkdir(tmp_path / "dir.bin")
    cases.append((str(tmp_path / "dir.bin"), lambda q: nd.TokenWindows(q, 8), "is a directory"))
    (tmp_path / "n.bin").write_bytes(b"")
    for q, make, what in cases:
        got = []

        def run():
            try:
                make(q)
            except Exception as e:     # noqa: BLE001
                got.append(e)
        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(20)
        if t.is_alive():              # release the reader blocked in open/read
            os.close(os.open(q, os.O_WRONLY | os.O_NONBLOCK))
            t.join(5)
            pytest.fail("%s: the dataset waited on it" % q)
        assert got and isinstance(got[0], nd.DataFormatError), got
        assert q in str(got[0]) and what in str(got[0]), str(got[0])


def test_cached_bytes_memory_does_not_grow_with_the_file(tmp_path, monkeypatch):
    """direct="auto" asks mincore what of the corpus is cached: one page
    flag per page of a corpus of terabytes must not be held at once."""
    import tracemalloc
    import nvio.data._read as r
    page = os.sysconf("SC_PAGE_SIZE")
    small = str(tmp_path / "small.bin")
    with open(small, "wb") as f:
        f.write(os.urandom(10 * page + 100))            # written: in the page cache
    with open(small, "rb") as f:
        f.read()
    whole = r.cached_bytes(small)
    assert whole == 11 * page
    monkeypatch.setattr(r, "MINCORE_PAGES", 3, raising=False)  # chunk edges: 3,3,3,2
    assert r.cached_bytes(small) == whole
    monkeypatch.undo()
    big = str(tmp_path / "sparse.bin")
    with open(big, "wb") as f:
        f.truncate(64 << 30)                            # 16 Mi pages, none cached
    tracemalloc.start()
    try:
        assert r.cached_bytes(big) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, "cached_bytes of a 64 GiB file held %d bytes" % peak


# --- device memory (a real GPU or the simulator) ---------------------------------------


@pytest.fixture(scope="module")
def gpu():
    if torch.cuda.is_available():
        yield None
        return
    import gpusim
    from nvio import _device
    sim = gpusim.load()
    prov = gpusim.TorchProvider(sim)
    old = _device._set_provider(prov)
    yield prov
    _device._set_provider(old)
    prov.close()


@pytest.mark.parametrize("gds", [False, True], ids=["bounce", "gds"])
def test_batches_land_in_device_memory(gpu, engine, gds, tmp_path):
    p = str(tmp_path / "t.bin")
    toks = tokens_file(p, 300_000)
    ds = nd.TokenWindows(p, 1023, engine=engine, gds=gds)
    idx = list(np.random.default_rng(6).integers(0, len(ds), 40)) + [3, 4]
    b = ds.read_batch(idx, device="cuda")
    assert b.shape == (42, 1024)
    s = b.untyped_storage()
    want = np.stack([toks[i:i + 1024] for i in idx]).tobytes()
    if gpu is None:
        assert b.is_cuda and b.cpu().numpy().tobytes() == want
    else:
        assert gpu.owns(s) and gpu.bytes(b)[:len(want)] == want
    batches = list(nd.BatchLoader(ds, batch_size=8, sampler=idx[:32], device="cuda", prefetch=2))
    for k, bb in enumerate(batches):
        w = np.stack([toks[i:i + 1024] for i in idx[8 * k:8 * k + 8]]).tobytes()
        got = bb.cpu().numpy().tobytes() if gpu is None else gpu.bytes(bb)[:len(w)]
        assert got == w, k
