"""nvio.safetensors behaves as the safetensors library (0.8) where code
written for it can tell: the same files byte for byte (torch and NumPy,
save_model), the same results and exception types for backend=, slicing,
closed files, meta tensors, bad keys and missing files, the same shared-
tensor helpers. Every case runs the library and nvio side by side; the
library's own test suite runs in tests/peers/safetensors_suite.py.
"""
import errno
import json
import os
import pickle
import threading
import warnings

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
safetensors = pytest.importorskip("safetensors")
st = pytest.importorskip("safetensors.torch")
st_np = pytest.importorskip("safetensors.numpy")
from nvio import safetensors as nst  # noqa: E402
from nvio.safetensors import numpy as nst_np  # noqa: E402
from nvio.safetensors import torch as nst_torch  # noqa: E402

import nvio_testutil  # noqa: E402


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def outcome(fn):
    """("ok", value) or ("raised", exception)."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001  (compared by the caller)
        return "raised", e


def same_outcome(ref, got, compare):
    """got (nvio's) is what ref (the library's) is: equal values, or an
    exception of the library's type (nvio's may be a subclass)."""
    assert ref[0] == got[0], (ref, got)
    if ref[0] == "raised":
        assert isinstance(got[1], type(ref[1])), (type(ref[1]), type(got[1]), got[1])
    else:
        compare(ref[1], got[1])


def same_tensor(a, b):
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape), (a.dtype, b.dtype,
                                                                      a.shape, b.shape)
    assert raw(a) == raw(b)


def same_array(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    assert a.tobytes() == b.tobytes()


@pytest.fixture
def model_file(tmp_path):
    g = torch.Generator().manual_seed(5)
    d = {"w": torch.randn((10, 6), generator=g), "v": torch.randn((4, 3, 5), generator=g),
         "i": torch.arange(12, dtype=torch.int32), "s": torch.tensor(2.5),
         "e": torch.empty((0, 3), dtype=torch.float16)}
    p = tmp_path / "m.safetensors"
    st.save_file(d, p, metadata={"k": "v"})
    return p, d


# --- backend= ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_backend_values(handle, model_file, backend):
    p, d = model_file
    got = nst.load_file(p, backend=backend, handle=handle)
    nvio_testutil.same(got, st.load_file(p, backend=backend))
    with nst.safe_open(p, "pt", backend=backend, handle=handle) as f:
        assert f.metadata() == {"k": "v"}
        nvio_testutil.same(f.get_tensors(), d)
        same_tensor(f.get_slice("w")[:, 1:3], d["w"][:, 1:3])
    arrays = nst_np.load_file(p, backend=backend, handle=handle)
    ref = st_np.load_file(p, backend=backend)
    assert list(arrays) == list(ref) or sorted(arrays) == sorted(ref)
    for k in ref:
        same_array(arrays[k], ref[k])


@pytest.mark.parametrize("backend", ["not_a_backend", "MMAP", "", None, 1])
def test_backend_refused_as_safetensors_refuses(model_file, backend):
    p, _ = model_file
    ref = outcome(lambda: safetensors.safe_open(str(p), "pt", backend=backend))
    assert ref[0] == "raised"
    for call in (lambda: nst.safe_open(p, "pt", backend=backend),
                 lambda: nst.load_file(p, backend=backend),
                 lambda: nst_np.load_file(p, backend=backend),
                 lambda: nst.load_model(torch.nn.Linear(2, 2), p, backend=backend)):
        same_outcome(ref, outcome(call), None)


# --- NumPy: the same files and arrays -------------------------------------------------


def np_cases():
    rng = np.random.default_rng(3)
    return {
        "f64": rng.standard_normal((3, 5)), "f32": rng.standard_normal(7).astype(np.float32),
        "f16": rng.standard_normal((2, 2, 3)).astype(np.float16),
        "i64": rng.integers(-9, 9, (4,)), "u64": np.arange(5, dtype=np.uint64),
        "i32": np.arange(6, dtype=np.int32).reshape(2, 3), "u32": np.arange(3, dtype=np.uint32),
        "i16": np.arange(9, dtype=np.int16), "u16": np.arange(2, dtype=np.uint16),
        "i8": np.arange(-3, 3, dtype=np.int8), "u8": np.arange(11, dtype=np.uint8),
        "bool": np.array([True, False, True]), "scalar_bool": np.asarray(False),
        "c64": (rng.standard_normal(4) + 1j).astype(np.complex64),
        "scalar": np.array(5000.0), "empty": np.zeros((0, 4), dtype=np.float32),
        "big_endian": np.arange(6, dtype=">i4").reshape(3, 2),
        "big_endian_f8": np.arange(4, dtype=">f8"),
    }


# one metadata key: the library writes several in random order
@pytest.mark.parametrize("metadata", [None, {}, {"é\n\"": "ü"}])
def test_numpy_files_byte_exact(handle, tmp_path, metadata):
    d = np_cases()
    ref = st_np.save(d, metadata=metadata)
    assert nst_np.save(d, metadata=metadata) == ref
    p, q = tmp_path / "nvio.safetensors", tmp_path / "ref.safetensors"
    nst_np.save_file(d, p, metadata=metadata, handle=handle)
    st_np.save_file(d, str(q), metadata=metadata)
    assert p.read_bytes() == q.read_bytes() == ref
    for got, want in ((nst_np.load_file(p, handle=handle), st_np.load_file(str(q))),
                      (nst_np.load(ref), st_np.load(ref))):
        assert sorted(got) == sorted(want)
        for k in want:
            same_array(got[k], want[k])


def test_numpy_non_contiguous_saves_its_values(tmp_path):
    a = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    assert nst_np.save({"a": a}) == st_np.save({"a": np.ascontiguousarray(a)})


@pytest.mark.parametrize("case", ["not a dict", "not an array", "int key", "object dtype"])
def test_numpy_refusals(case):
    bad = {"not a dict": [np.zeros(2)], "not an array": {"a": [1, 2]},
           "int key": {1: np.zeros(2)}, "object dtype": {"a": np.array([None])}}[case]
    with pytest.raises((ValueError, TypeError)) as e:
        nst_np.save(bad)
    if case == "int key":
        assert e.type is TypeError


def test_numpy_safe_open(handle, tmp_path):
    d = np_cases()
    p = tmp_path / "a.safetensors"
    st_np.save_file(d, str(p))
    with nst.safe_open(p, "np", handle=handle) as f, safetensors.safe_open(str(p), "np") as g:
        assert f.keys() == g.keys()
        for k in g.keys():
            same_array(f.get_tensor(k), g.get_tensor(k))


# --- slicing ---------------------------------------------------------------------------

PT_INDEXES = [None, (None,), (None, 1), slice(None, None, 2), Ellipsis, (Ellipsis, 1),
              (Ellipsis, None), torch.tensor(1), (torch.tensor(1), slice(1, 3)), np.int64(2),
              slice(-3, None), slice(5, 2), [], [1], [1, 3], (1,), (), slice(2, 20),
              torch.tensor([1, 2]), torch.tensor([True] * 5 + [False] * 5), True, False,
              slice(None, -1), slice(None, None, -1), (slice(None), [0, 4]), 1.5, -11, 10,
              (slice(None), -6), (1, 2, 3), "a", [[]], (slice(torch.tensor(1), torch.tensor(3)),)]


@pytest.mark.parametrize("i", range(len(PT_INDEXES)), ids=[repr(x)[:30] for x in PT_INDEXES])
def test_torch_slicing_like_safetensors(model_file, i):
    """get_slice(...)[index] under 'pt' gives what safetensors gives (it
    indexes as torch does) or raises the same type."""
    p, _ = model_file
    idx = PT_INDEXES[i]
    with nst.safe_open(p, "pt") as f, safetensors.safe_open(str(p), "pt") as g, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")        # torch's on non-tuple sequence indexes
        ref = outcome(lambda: g.get_slice("w")[idx])
        got = outcome(lambda: f.get_slice("w")[idx])
    same_outcome(ref, got, same_tensor)


NP_INDEXES = [slice(None), (), slice(None, 2), (slice(None), slice(None, 2)), (0, slice(None, 2)),
              (slice(2, None), 0), (slice(2, None), -1), (slice(2, None), -5), [], (3,), 9,
              (slice(2, None), -6), [0, 1], (slice(2, None), 20), slice(None, 20),
              (slice(None), slice(None, 20)), (20, slice(None, 20)), (slice(1, 3), slice(1, 3)),
              np.int32(4), slice(10, None), (0, 0, 0), (1, 2, slice(None)), slice(3, 3),
              slice(None, None, 2), (slice(1, 9, 3), slice(None, None, 2))]


@pytest.mark.parametrize("i", range(len(NP_INDEXES)), ids=[repr(x)[:30] for x in NP_INDEXES])
def test_numpy_slicing_like_safetensors(tmp_path, i):
    """Under 'np' the index is safetensors' own subset, its errors worded
    as its are (its suite compares them)."""
    a = np.random.default_rng(1).random((10, 5))
    p = tmp_path / "a.safetensors"
    st_np.save_file({"a": a}, str(p))
    idx = NP_INDEXES[i]
    with nst.safe_open(p, "np") as f, safetensors.safe_open(str(p), "np") as g:
        ref = outcome(lambda: g.get_slice("a")[idx])
        got = outcome(lambda: f.get_slice("a")[idx])
    same_outcome(ref, got, same_array)
    if ref[0] == "raised" and isinstance(ref[1], safetensors.SafetensorError):
        assert str(got[1]) == str(ref[1])


# Indexes whose errors safetensors' suite does not compare: the same values
# and exception types (code catches SafetensorError), nvio's own wording.
NP_MORE = [Ellipsis, (Ellipsis, 1), (0, Ellipsis), (Ellipsis, slice(1, 3)), (Ellipsis, 9),
           (Ellipsis, 0, 0, 0), (Ellipsis, Ellipsis), slice(None, None, -1), slice(0, 4, 0),
           "a", 1.5, None, (None,), np.array([1]), slice(0.5, 2), slice(0, 4, 1.0)]


@pytest.mark.parametrize("i", range(len(NP_MORE)), ids=[repr(x)[:30] for x in NP_MORE])
def test_numpy_slicing_ellipsis_and_refusals_like_safetensors(tmp_path, i):
    """Ellipsis selects as in safetensors; what it refuses (steps not
    positive, other index types) is a SafetensorError (TypeError for bounds
    that are not integers) naming the file and
    the tensor, never a bare IndexError or TypeError."""
    a = np.random.default_rng(2).random((10, 5))
    p = tmp_path / "a.safetensors"
    st_np.save_file({"a": a}, str(p))
    idx = NP_MORE[i]
    with nst.safe_open(p, "np") as f, safetensors.safe_open(str(p), "np") as g:
        ref = outcome(lambda: g.get_slice("a")[idx])
        got = outcome(lambda: f.get_slice("a")[idx])
    same_outcome(ref, got, same_array)
    if got[0] == "raised":
        assert isinstance(got[1], (nst.SafetensorsError, TypeError)), got
        assert str(p) in str(got[1]) or "Error during slicing" in str(got[1]), got


@pytest.mark.parametrize("fw", ["pt", "np"])
@pytest.mark.parametrize("name", [3, None, b"w", ("w",)])
def test_non_str_tensor_name_is_a_type_error(model_file, fw, name):
    """get_tensor/get_slice of a name that is no str: TypeError as the
    library raises (code catching it missed nvio's SafetensorsError)."""
    p, _ = model_file
    with nst.safe_open(p, fw) as f, safetensors.safe_open(str(p), fw) as g:
        for call in ("get_tensor", "get_slice"):
            ref = outcome(lambda: getattr(g, call)(name))
            got = outcome(lambda: getattr(f, call)(name))
            same_outcome(ref, got, None)
            assert str(p) in str(got[1]), got


def test_slice_reads_rows_not_the_tensor(model_file, monkeypatch):
    """A plain index still reads only its rows: the whole-tensor fallback
    is for the indexes nvio cannot cut into byte runs."""
    from nvio.safetensors import _lazy
    p, d = model_file
    called = []
    monkeypatch.setattr(_lazy, "_whole", lambda o, e: called.append(e.name))
    with nst.safe_open(p) as f:
        same_tensor(f.get_slice("w")[2:4, np.int64(1)], d["w"][2:4, 1])
    assert called == []


# --- closed files, meta tensors, keys, missing files ---------------------------------


@pytest.mark.parametrize("call", ["keys", "metadata", "offset_keys", "get_tensor", "get_slice",
                                  "get_tensors", "slice"])
def test_closed_file_refuses_like_safetensors(model_file, call):
    p, _ = model_file
    ops = {"keys": lambda f: f.keys(), "metadata": lambda f: f.metadata(),
           "offset_keys": lambda f: f.offset_keys(), "get_tensor": lambda f: f.get_tensor("w"),
           "get_slice": lambda f: f.get_slice("w"), "get_tensors": lambda f: f.get_tensors()}
    with nst.safe_open(p) as f:
        s = f.get_slice("w")
    if call == "slice":
        with pytest.raises(safetensors.SafetensorError, match="closed"):
            s[0]
        return
    with safetensors.safe_open(str(p), "pt") as g:
        pass
    ref = outcome(lambda: ops[call](g))
    assert ref[0] == "raised"
    with pytest.raises(type(ref[1]), match="closed"):
        ops[call](f)


@pytest.mark.parametrize("fn", ["save", "save_file"])
def test_meta_tensor_is_a_runtime_error(tmp_path, fn):
    d = {"m": torch.zeros((3, 3), device="meta")}
    args = (d,) if fn == "save" else (d, tmp_path / "x.safetensors")
    ref = outcome(lambda: getattr(st, fn)(*args))
    got = outcome(lambda: getattr(nst, fn)(*args))
    same_outcome(ref, got, None)
    assert isinstance(got[1], RuntimeError)
    assert "meta" in str(got[1]) and "'m'" in str(got[1])
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("key", [1, None, b"a", ("a",)])
def test_non_str_key_is_a_type_error(tmp_path, key):
    d = {key: torch.zeros(2)}
    for fn, args in (("save", (d,)), ("save_file", (d, tmp_path / "x.safetensors"))):
        ref = outcome(lambda: getattr(st, fn)(*args))
        got = outcome(lambda: getattr(nst, fn)(*args))
        same_outcome(ref, got, None)
        assert type(got[1]) is TypeError and repr(key) in str(got[1])
    with pytest.raises(TypeError):
        nst_np.save({key: np.zeros(2)})


def test_missing_file_names_path_and_errno(tmp_path):
    p = str(tmp_path / "nope.safetensors")
    ref = outcome(lambda: safetensors.safe_open(p, "pt"))
    for call in (lambda: nst.safe_open(p, "pt"), lambda: nst.load_file(p),
                 lambda: nst_np.load_file(p), lambda: nst.load_model(torch.nn.Linear(1, 1), p)):
        got = outcome(call)
        same_outcome(ref, got, None)
        e = got[1]
        assert str(e) == str(ref[1]) == "No such file or directory: %s" % p
        assert e.errno == errno.ENOENT and e.filename == p
        assert "offset" not in str(e) and "op 0" not in str(e)
        # it crosses process boundaries whole (multiprocessing, executors pickle it)
        back = pickle.loads(pickle.dumps(e))
        assert isinstance(back, type(ref[1])) and type(back).__mro__[1:] == type(e).__mro__[1:]
        assert (str(back), back.errno, back.filename) == (str(e), e.errno, e.filename)


def test_other_open_failures_name_the_path(tmp_path):
    d = tmp_path / "dir.safetensors"
    d.mkdir()
    with pytest.raises(OSError) as e:
        nst.safe_open(d)
    assert str(d) in str(e.value) and e.value.errno == errno.EISDIR
    assert "op 0" not in str(e.value)
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as e:
        nst.load_file(fifo)
    assert str(fifo) in str(e.value) and "FIFO" in str(e.value)
    with pytest.raises(OSError) as e:
        nst.save_file({"a": torch.zeros(1)}, tmp_path / "no" / "such" / "dir.safetensors")
    assert e.value.errno == errno.ENOENT and "no/such/dir.safetensors" in str(e.value)


def _bounded(fn, timeout=20):
    """fn() in a thread; its outcome, or ("hung", None) after timeout."""
    box = []
    t = threading.Thread(target=lambda: box.append(outcome(fn)), daemon=True)
    t.start()
    t.join(timeout)
    return box[0] if box else ("hung", None)


@pytest.mark.parametrize("name", ["model.safetensors.index.json", "other.safetensors.index.json"])
def test_fifo_index_is_an_error_not_a_hang(tmp_path, name):
    d = tmp_path / "model"
    d.mkdir()
    st.save_file({"a": torch.zeros(2)}, d / "model-00001-of-00001.safetensors")
    os.mkfifo(d / name)
    try:
        got = _bounded(lambda: nst.load_model_dir(d))
    finally:
        # free a reader the old code left blocked in open()
        try:
            os.close(os.open(d / name, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert got[0] == "raised", got
    assert isinstance(got[1], nst.SafetensorsError)
    assert name in str(got[1]) and "FIFO" in str(got[1])


# --- shared tensors: helpers, save_model, load_model ----------------------------------


def shared_cases():
    a = torch.zeros((4, 4))
    b = torch.zeros(8)
    meta = torch.zeros((2, 2), device="meta")
    m = torch.randn(10)
    n = torch.empty([], dtype=m.dtype)
    n.set_(m.untyped_storage()[:16])
    return [
        {"a": a, "b": a[:1]}, {"a": a}, {"b": a[:1]}, {"x": b[:4], "y": b[4:]},
        {"x": b[:4], "y": b[3:]}, {"x": b[:4], "y": b[4:], "z": b[:1]}, {"c": meta, "d": meta[:1]},
        {"m": m, "n": n}, {"s": b[::2], "u": b[1::2]},
        {"a": a, "b": a, "c": a[1:], "e": torch.empty(0)},
    ]


@pytest.mark.parametrize("i", range(len(shared_cases())))
def test_shared_helpers_equal_safetensors(i):
    d = shared_cases()[i]
    assert nst_torch._find_shared_tensors(d) == st._find_shared_tensors(d)
    for k, v in d.items():
        assert nst_torch._is_complete(v) == st._is_complete(v), k
        assert nst_torch.storage_ptr(v) == st.storage_ptr(v), k
        assert nst_torch.storage_size(v) == st.storage_size(v), k
        if v.device.type != "meta" and v.is_contiguous():
            assert nst_torch._end_ptr(v) == st._end_ptr(v), k
    same_outcome(outcome(lambda: st._remove_duplicate_names(d)),
                 outcome(lambda: nst_torch._remove_duplicate_names(d)),
                 lambda a, b: (a == b) or pytest.fail("%r != %r" % (a, b)))


def test_shared_non_contiguous_views():
    """A transposed view overlapping its base shares with it (safetensors'
    helper fails on it: RuntimeError from view(-1))."""
    a = torch.zeros((4, 4))
    d = {"a": a, "t": a.t()}
    assert nst_torch._find_shared_tensors(d) == [{"a", "t"}]
    assert nst_torch._remove_duplicate_names(d) == {"a": ["t"]}
    assert nst_torch._end_ptr(a.t()) == a.data_ptr() + 16 * 4


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.mid = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight


class Untied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.mid = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)


class Transposed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 3)
        self.lin.weight = torch.nn.Parameter(torch.randn(5, 3).t())


@pytest.mark.parametrize("cls", [Tied, Untied, Transposed])
@pytest.mark.parametrize("metadata", [None, {"note": "x"}])
def test_save_model_byte_exact(handle, tmp_path, cls, metadata):
    torch.manual_seed(0)
    m = cls()
    a, b = tmp_path / "nvio.safetensors", tmp_path / "ref.safetensors"
    nst.save_model(m, a, metadata=dict(metadata) if metadata else None, handle=handle)
    st.save_model(m, str(b), metadata=dict(metadata) if metadata else None)
    with safetensors.safe_open(str(a), "pt") as f:
        md = f.metadata()
    if md is None or len(md) < 2:
        assert a.read_bytes() == b.read_bytes()
    else:       # the library writes several metadata keys in random order
        x, y = a.read_bytes(), b.read_bytes()
        n = int.from_bytes(x[:8], "little")
        assert x[:8] == y[:8] and x[8 + n:] == y[8 + n:]
        assert json.loads(x[8:8 + n]) == json.loads(y[8:8 + n])
    if cls is Tied:
        assert md["head.weight"] == "emb.weight"


def test_save_model_refuses_non_contiguous_like_safetensors(tmp_path):
    m = Transposed()
    ref = outcome(lambda: st.save_model(m, str(tmp_path / "r.safetensors"),
                                        force_contiguous=False))
    got = outcome(lambda: nst.save_model(m, tmp_path / "n.safetensors", force_contiguous=False))
    same_outcome(ref, got, None)
    assert "force_contiguous=True" in str(got[1])


@pytest.mark.parametrize("force", [True, False])
def test_save_model_other_refusals_keep_their_error(tmp_path, force):
    """A tensor refused for another reason than contiguity (a dtype
    safetensors lacks) keeps its ValueError, naming the tensor, with
    no advice to pass force_contiguous=True (given, or beside the point)."""
    m = torch.nn.Module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # torch: ComplexHalf is experimental
        m.register_buffer("c", torch.zeros(4, dtype=torch.complex32))
    with pytest.raises(ValueError) as ei:
        nst.save_model(m, tmp_path / "n.safetensors", force_contiguous=force)
    assert "'c'" in str(ei.value) and "complex32" in str(ei.value)
    assert "force_contiguous" not in str(ei.value)
    assert not (tmp_path / "n.safetensors").exists()


@pytest.mark.parametrize("src,dst", [(Tied, Tied), (Untied, Untied), (Tied, Untied),
                                     (Untied, Tied)])
@pytest.mark.parametrize("strict", [True, False])
def test_load_model_like_safetensors(handle, tmp_path, src, dst, strict):
    torch.manual_seed(1)
    p = tmp_path / "m.safetensors"
    st.save_model(src(), str(p))
    torch.manual_seed(2)
    mine, theirs = dst(), dst()
    theirs.load_state_dict(mine.state_dict())
    ref = outcome(lambda: st.load_model(theirs, str(p), strict=strict))
    got = outcome(lambda: nst.load_model(mine, p, strict=strict, handle=handle))
    same_outcome(ref, got, lambda a, b: (sorted(a[0]) == sorted(b[0]) and
                                         sorted(a[1]) == sorted(b[1])) or
                 pytest.fail("%r != %r" % (a, b)))
    if ref[0] == "raised":
        for line in str(ref[1]).splitlines()[1:]:
            assert line in str(got[1])
    nvio_testutil.same(mine.state_dict(), theirs.state_dict())
    if dst is Tied:
        assert mine.head.weight.data_ptr() == mine.emb.weight.data_ptr()


def test_torch_module_has_the_library_names():
    """Every public name of safetensors.torch that nvio mirrors, and the
    helpers its users import, are in nvio.safetensors.torch."""
    for name in ("load", "load_file", "save", "save_file", "load_model", "save_model",
                 "storage_ptr", "storage_size", "_find_shared_tensors", "_is_complete",
                 "_end_ptr", "_remove_duplicate_names"):
        assert callable(getattr(nst_torch, name)), name
    for name in ("load", "load_file", "save", "save_file"):
        assert callable(getattr(nst_np, name)), name


def test_index_json_with_fifo_shard_path_still_loads(tmp_path):
    """A regular index file still loads (the non-blocking open reads it)."""
    d = tmp_path / "m"
    d.mkdir()
    st.save_file({"a": torch.ones(3)}, d / "s1.safetensors")
    st.save_file({"b": torch.zeros(2)}, d / "s2.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    got = nst.load_model_dir(d)
    same_tensor(got["a"], torch.ones(3))
    same_tensor(got["b"], torch.zeros(2))
