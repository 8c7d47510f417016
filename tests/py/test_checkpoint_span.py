"""nvio.load's one-read path: when the tensor records of a checkpoint lie
densely in the file (nvio's and torch.save's files) and weights_only=True,
every record is read with one read into one region, started before the
pickle is parsed, and each storage is a slice of that region. Compared
element by element with torch.load on every engine, direct I/O on and
off; storages stay independent; truncation, corruption (verify=True),
pinned memory and storages restored elsewhere (map_location) still work."""
import pytest

import nvio
from nvio.checkpoint import _load

torch = pytest.importorskip("torch")


def state():
    g = torch.Generator().manual_seed(5)
    base = torch.randn(300, 1000, generator=g)
    return {
        "big": base,
        "view": base[10:20, 5:],                  # shares base's storage
        "t": base.t(),                            # non-contiguous view
        "many": [torch.randn(1000 + i, generator=g) for i in range(50)],
        "bf16": torch.randn(700, generator=g).to(torch.bfloat16),
        "i8": torch.randint(-100, 100, (333,), dtype=torch.int8, generator=g),
        "empty": torch.empty(0),
        "scalar": torch.tensor(3.5),
        "plain": {"lr": 0.1, "name": "x"},
    }


def check_equal(got, want):
    assert got.keys() == want.keys()
    for k in want:
        a, b = got[k], want[k]
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), k
            assert torch.equal(a, b), k
        elif isinstance(b, list):
            assert all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b), k
        else:
            assert a == b, k


@pytest.mark.parametrize("writer", ["nvio", "torch"])
def test_span_load_equals_torch_load(tmp_path, handle, writer):
    sd = state()
    p = tmp_path / "ck.pt"
    if writer == "nvio":
        nvio.save(sd, p, handle=handle)
    else:
        torch.save(sd, p)
    with handle.open(p) as f:
        assert _load._Span.worth(_load.open_index(f, str(p)))
    got = nvio.load(p, handle=handle)
    check_equal(got, torch.load(p))
    check_equal(got, sd)
    # views still share their storage, distinct tensors do not
    assert got["view"].untyped_storage().data_ptr() == got["big"].untyped_storage().data_ptr()
    got["many"][0].fill_(7)
    assert torch.equal(got["many"][1], sd["many"][1])
    assert torch.equal(got["big"], sd["big"])
    got2 = nvio.load(p, handle=handle, verify=True, pin_memory=True)
    check_equal(got2, sd)


def test_span_load_truncated_and_corrupt(tmp_path):
    sd = state()
    p = tmp_path / "ck.pt"
    nvio.save(sd, p)
    good = p.read_bytes()
    with nvio.AioHandle().open(p) as f:
        ix = _load.open_index(f, str(p))
        e = ix.entries["ck/data/0"]
    q = tmp_path / "short.pt"
    q.write_bytes(good[:e.data_offset + 1000])
    with pytest.raises(Exception) as ei:
        nvio.load(q)
    assert "truncat" in str(ei.value) and str(q) in str(ei.value)
    bad = bytearray(good)
    bad[e.data_offset + 12345] ^= 0x10
    q = tmp_path / "flip.pt"
    q.write_bytes(bad)
    with pytest.raises(nvio.CheckpointError) as ei:
        nvio.load(q, verify=True)
    assert "ck/data/0" in str(ei.value) and "CRC" in str(ei.value)


def test_span_with_map_location_callable(tmp_path):
    """Storages a callable map_location restores are read on their own
    (before the callable sees them), not from the region."""
    sd = state()
    p = tmp_path / "ck.pt"
    nvio.save(sd, p)
    seen = []

    def loc(storage, location):
        seen.append(location)
        return storage
    got = nvio.load(p, map_location=loc)
    check_equal(got, torch.load(p, map_location=loc))
    assert seen and set(seen) == {"cpu"}


def test_span_read_failure_is_raised(tmp_path, handle, monkeypatch):
    """The one read failing (EIO at its completion, injected into its
    future after the real read) fails the load with that error: never
    tensors of whatever the region held."""
    import errno
    sd = state()
    p = tmp_path / "ck.pt"
    nvio.save(sd, p, handle=handle)
    real_init = _load._Span.__init__

    def failing(self, f, ix, pin):
        real_init(self, f, ix, pin)
        fut = self.fut

        def eio():
            fut.result()
            raise nvio.NvioError(errno.EIO, "injected EIO reading %s" % p)
        self.fut = _Later(eio)
        torch.frombuffer(self.mv, dtype=torch.uint8).zero_()
    monkeypatch.setattr(_load._Span, "__init__", failing)
    with pytest.raises(nvio.NvioError) as ei:
        nvio.load(p, handle=handle)
    assert ei.value.errno == errno.EIO and str(p) in str(ei.value)


@pytest.mark.parametrize("big", [False, True])
def test_rebuilds_that_read_tensor_data_see_it(tmp_path, handle, monkeypatch, big):
    """A nested tensor is rebuilt from its size and stride tensors while
    the pickle is parsed: their storages must hold the file's bytes by then
    (the span's read ended, the others read). The span's bytes arrive only
    when it is waited for, so a rebuild before that sees zeros."""
    import warnings
    warnings.simplefilter("ignore")
    nt = torch.nested.nested_tensor([torch.randn(2, 5), torch.randn(3, 5)])
    sd = {"n": nt}
    if big:
        sd["w"] = torch.randn(1 << 20)
    real_init = _load._Span.__init__

    def lazy_init(self, f, ix, pin):
        real_init(self, f, ix, pin)
        self.fut.result()
        torch.frombuffer(self.mv, dtype=torch.uint8).zero_()     # as if not read yet
        self.fut = _Later(lambda: f.pread(self.mv, self.base))   # read when waited for
    monkeypatch.setattr(_load._Span, "__init__", lazy_init)
    for writer in (torch.save, nvio.save):
        p = tmp_path / "n.pt"
        writer(sd, p)
        got = nvio.load(p, handle=handle)["n"]
        assert [t.shape for t in got.unbind()] == [t.shape for t in nt.unbind()]
        assert all(torch.equal(a, b) for a, b in zip(got.unbind(), nt.unbind()))
        if big:
            assert torch.equal(nvio.load(p, handle=handle)["w"], sd["w"])


class _Later:
    """A future whose work runs when its result is asked for."""

    def __init__(self, fn):
        self.fn = fn

    def result(self):
        return self.fn()
