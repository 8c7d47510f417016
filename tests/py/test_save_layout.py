"""How nvio.save's direct path (_base.plan.write_plans) writes the
file (issue 33): every write starts and ends on a page but the file's last
(no byte through the page cache in the middle of an O_DIRECT file: 0-dim
AdamW steps, odd sizes, small tensors ride with the headers), the writes
cover the file exactly once, the runs between large tensors go in one
vectored op submitted before the data op is waited for (not a hole per
record filled after the data drained), and the file is torch's zip that
torch.load reads back bit for bit. On every engine, buffered and direct.
"""
import os
import zipfile

import pytest

torch = pytest.importorskip("torch")

import nvio  # noqa: E402
from nvio import _nvio  # noqa: E402
from nvio._base import plan as _plan  # noqa: E402
from nvio._base.plan import Plan  # noqa: E402
from nvio.checkpoint import _save  # noqa: E402

PAGE = 4096


def _nbytes(buf):
    if isinstance(buf, torch.Tensor):
        return buf.numel() * buf.element_size()
    return memoryview(buf).nbytes


class _Recorder:
    """An nvio File that records its writes: calls (kind, [(offset,
    length)]) and events in order ("submit N", "wait N")."""

    def __init__(self, f):
        self._f = f
        self.calls = []
        self.events = []

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        self._f.__enter__()
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def _note(self, kind, items):
        self.calls.append((kind, [(off, _nbytes(b)) for b, off in items]))
        self.events.append("submit %d" % (len(self.calls) - 1))
        return len(self.calls) - 1

    def pwritev_async(self, items, offset, crc32=None):
        assert offset == _nvio.OFFSET_PER_IOV
        i = self._note("v", items)
        if crc32 is not None:
            self.events.append("crc32 %d" % i)
        return _Fut(self._f.pwritev_async(items, offset, crc32=crc32), self.events, i)

    def pwritev(self, items, offset):
        assert offset == _nvio.OFFSET_PER_IOV
        i = self._note("v", items)
        self.events.append("wait %d" % i)
        return self._f.pwritev(items, offset)

    def pwrite_async(self, buf, off):
        i = self._note("1", [(buf, off)])
        return _Fut(self._f.pwrite_async(buf, off), self.events, i)

    def pwrite(self, buf, off):
        i = self._note("1", [(buf, off)])
        self.events.append("wait %d" % i)
        return self._f.pwrite(buf, off)


class _Fut:
    def __init__(self, fut, events, i):
        self._fut, self._events, self._i = fut, events, i

    def result(self, *a):
        self._events.append("wait %d" % self._i)
        return self._fut.result(*a)

    def __getattr__(self, name):
        return getattr(self._fut, name)


def _state(big):
    g = torch.Generator().manual_seed(7)
    n = big // 4
    sd = {
        "w1": torch.randn(n, generator=g),                      # page multiple
        "odd": torch.randn(n + 3, generator=g),                 # unaligned end
        "bf16": torch.randn(n + 1, generator=g).to(torch.bfloat16),
        "ids": torch.randint(0, 1 << 40, (n // 2 + 5,), generator=g, dtype=torch.int64),
        "norm": torch.randn(1024, generator=g),                 # one page
        "empty": torch.empty(0),
        "counter": torch.tensor(123456789, dtype=torch.int64),
    }
    opt = {i: {"step": torch.tensor(float(i)), "exp_avg": torch.randn(n // 3 + i, generator=g)}
           for i in range(5)}
    sd["opt"] = opt
    sd["view"] = sd["w1"][10:50]               # shares w1's storage
    return sd


def _flat(o, pre=""):
    if isinstance(o, torch.Tensor):
        return [(pre, o)]
    out = []
    for k, v in o.items():
        out += _flat(v, "%s/%s" % (pre, k))
    return out


def _same(a, b):
    fa, fb = _flat(a), _flat(b)
    assert [k for k, _ in fa] == [k for k, _ in fb]
    for (k, x), (_, y) in zip(fa, fb):
        assert x.dtype == y.dtype and x.shape == y.shape, k
        assert torch.equal(x.contiguous().reshape(-1).view(torch.uint8),
                           y.contiguous().reshape(-1).view(torch.uint8)), k


@pytest.mark.parametrize("align", [4096, 64])
def test_writes_cover_the_file_once_on_pages(handle, tmp_path, align):
    sd = _state(3 * _plan.DIRECT_MIN + 100)
    p = str(tmp_path / "ck.pt")
    plan = Plan(sd, p, align)
    assert not _save._packs(plan)
    with handle.open(p, _nvio.FILE_ATOMIC) as nf:
        rec = _Recorder(nf)
        _save.write_plan(plan, rec)
        nf.commit()
    ranges = sorted((off, off + n) for _, items in rec.calls for off, n in items if n)
    pos = 0
    for a, b in ranges:
        assert a == pos, "hole or overlap at %d (%r)" % (pos, ranges)
        assert a % PAGE == 0, "write at %d is not on a page" % a
        assert b % PAGE == 0 or b == plan.size, "write ending at %d is not on a page" % b
        pos = b
    assert pos == plan.size == os.path.getsize(p)
    # two vectored writes: the large tensors' pages, then the runs between them
    direct = [r for r, s in plan.data if len(set(_plan.direct_range(r, s))) == 2]
    assert len(direct) >= 4
    assert [k for k, _ in rec.calls] == ["v", "v"]
    assert len(rec.calls[0][1]) == len(direct)
    assert len(rec.calls[1][1]) == len(direct) + 1
    # the runs carry the descriptors: they go once the data op has ended
    # with its CRCs (libnvio takes them as it moves the tensors)
    assert rec.events.index("wait 0") < rec.events.index("submit 1")
    zipfile.ZipFile(p).testzip()
    _same(torch.load(p, weights_only=True), sd)
    _same(nvio.load(p), sd)


def test_save_and_spare_bytes_equal(handle, tmp_path):
    sd = _state(2 * _plan.DIRECT_MIN + 8)
    p = str(tmp_path / "ck.pt")
    for spare in (False, True, True, True):     # new, then the spare made, then reused
        nvio.save(sd, p, handle=handle, spare=spare)
        _same(torch.load(p, weights_only=True), sd)
        for t in _flat(sd):
            if t[1].dtype.is_floating_point and t[1].numel():
                t[1].add_(1)


class _RecHandle:
    """A handle whose files record their writes (.files: every one opened,
    .rec: the last), used with or without ``with``."""

    def __init__(self, h):
        self._h = h
        self.files = []

    @property
    def rec(self):
        return self.files[-1]

    def open(self, path, *a, **k):
        self.files.append(_Recorder(self._h.open(path, *a, **k)))
        self.files[-1].path = os.fspath(path)
        return self.files[-1]

    def __getattr__(self, name):
        return getattr(self._h, name)


def test_async_save_writes_windows_in_order_while_checksumming(handle, tmp_path, monkeypatch):
    from nvio.checkpoint import _async
    monkeypatch.setattr(_async, "WRITE_WINDOW", 64 << 10)
    sd = _state(3 * _plan.DIRECT_MIN + 100)
    p = str(tmp_path / "ck.pt")
    rh = _RecHandle(handle)
    with _async.AsyncCheckpointer(handle=rh) as ck:
        size = ck.save(sd, p).result()
    ranges = [(off, off + n) for _, items in rh.rec.calls for off, n in items]
    # the image goes window by window in file order, each one write
    assert len(ranges) == -(-size // (64 << 10)) > 8
    assert ranges == [(a, min(a + (64 << 10), size)) for a in range(0, size, 64 << 10)]
    # window k+1 is checksummed and started before window k is waited for
    assert rh.rec.events.index("submit 1") < rh.rec.events.index("wait 0")
    zipfile.ZipFile(p).testzip()
    _same(torch.load(p, weights_only=True), sd)
    _same(nvio.load(p), sd)


def test_dcp_writer_with_crc32_takes_them_from_the_data_op(handle, tmp_path):
    """nvio.dcp's writer with crc32=True writes a rank file of larger
    tensors as nvio.save writes its files: the tensors in one op that asks
    libnvio for their CRC-32s, then, once it has ended, the runs with the
    descriptors that carry them; no byte written twice."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import warnings

    import nvio.dcp as nd
    g = torch.Generator().manual_seed(3)
    sd = {"t%d" % i: torch.randn(30000 + 1000 * i, generator=g) for i in range(12)}
    sd["step"] = torch.tensor(5.0)
    rh = _RecHandle(handle)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # no process group: DCP says so
        dcp.save(sd, storage_writer=nd.FileSystemWriter(str(tmp_path), handle=rh,
                                                             crc32=True))
        out = {k: torch.empty_like(v) for k, v in sd.items()}
        dcp.load(out, storage_reader=nd.FileSystemReader(str(tmp_path)))
    _same(out, sd)
    (rec,) = [r for r in rh.files if r.path.endswith(".distcp")]
    import struct
    import zlib
    data = (tmp_path / "__0_0.distcp").read_bytes()
    for t in sd.values():   # every tensor record's descriptor carries its CRC
        b = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        assert struct.pack("<IIII", 0x08074B50, zlib.crc32(b), len(b), len(b)) in data
    assert [k for k, _ in rec.calls] == ["v", "v"]
    assert len(rec.calls[0][1]) == 12 and "crc32 0" in rec.events
    assert rec.events.index("wait 0") < rec.events.index("submit 1")
    ranges = sorted((o, o + n) for _, items in rec.calls for o, n in items)
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))     # no byte twice


def _layout_of(plan):
    sid = plan._pre + ".data/serialization_id"
    return ([(r.name, r.size, r.header_offset, r.data_offset, r.local, r.crc)
             for r in plan.layout.records if r.name != sid],
            {k: v for k, v in plan.meta.items() if k != sid},
            plan.layout.cursor, plan.dir_offset, plan.size,
            [(r.name, s.data_ptr()) for r, s in plan.data])


def test_plans_sharing_layouts_equal_plans_of_their_own():
    """Plan(layouts=): a plan whose pickle, storage sizes, alignments and
    archive match an earlier one's takes its layout; every plan equals the
    plan made alone (records, small records, sizes, its own storages and
    tensor records with no CRC), and only plans that must come out the same
    share: another dtype, shape, storage size (a view), alignment or
    archive name is laid out anew. The serialization id is each plan's."""
    base = torch.randn(64, 32)
    objs = [torch.randn(64, 32), torch.randn(64, 32), torch.randn(32, 64),
            torch.randn(64, 32).double(), base[:10], torch.randn(64, 32)[:10], base[10:20],
            torch.randn(2048),
            {"a": torch.randn(64, 32), "b": torch.randn(64, 32)},
            {"a": torch.randn(64, 32), "b": torch.randn(64, 32)}]
    kinds = [dict(align=4096), dict(align=8192), dict(align=4096, archive="other")]
    layouts = {}
    shared, ids = [], set()
    for kw in kinds:
        for o in objs:
            made = []
            orig = Plan._lay_out_like

            def spy(self, like):
                made.append(like)
                return orig(self, like)
            Plan._lay_out_like = spy
            try:
                p = Plan(o, "/x/ck.pt", meta_align=64, layouts=layouts, **kw)
            finally:
                Plan._lay_out_like = orig
            alone = Plan(o, "/x/ck.pt", meta_align=64, **kw)
            assert _layout_of(p) == _layout_of(alone)
            for r, _ in p.data:
                assert all(r is not q for q, _ in alone.data)
                if made:
                    assert all(r is not q for q, _ in made[0].data)
            ids.add(p.meta[p._pre + ".data/serialization_id"])
            shared.append(bool(made))
    # per kind: the 2nd (64x32 again), the 6th (a view like the 5th: same
    # offset, shape, storage size) and the 10th (the dict again) reuse; a
    # view at another offset does not, and nothing crosses kinds
    one = [False, True, False, False, False, True, False, False, False, True]
    assert shared == one * len(kinds)
    assert len(ids) == len(objs) * len(kinds)


def test_serialization_ids_differ_across_plans_and_a_fork():
    """Each plan draws its own serialization id (40 digits, as torch.save
    writes), from a generator reseeded in a forked child: the child's
    ids are not the parent's."""
    t = torch.randn(8)

    def sid():
        p = Plan(t, "/x/ck.pt")
        b = p.meta[p._pre + ".data/serialization_id"]
        assert len(b) == 40 and b.isdigit()
        return b
    mine = {sid() for _ in range(50)}
    assert len(mine) == 50
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                    # the child: its next ids, to the parent
        try:
            os.write(w, b"".join(sid() for _ in range(5)))
        finally:
            os._exit(0)
    os.close(w)
    got = b""
    while len(got) < 200:
        chunk = os.read(r, 200)
        if not chunk:
            break
        got += chunk
    os.close(r)
    os.waitpid(pid, 0)
    theirs = {got[i:i + 40] for i in range(0, len(got), 40)}
    ours = {sid() for _ in range(5)}
    assert len(theirs) == 5 and not theirs & (ours | mine)
