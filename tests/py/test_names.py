"""One meaning per name (issue 31 item 6): File, Stream and compat each name
one thing in nvio, and the public names renamed in 0.3 still work as
deprecated aliases (the same object, one DeprecationWarning per name,
pointing at the caller's line)."""
import importlib
import os
import re
import warnings

import pytest

import nvio
import nvio._renamed
import nvio.io
from nvio_testutil import pattern

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

# module, old name, new name (in the module or "module:attr")
RENAMED = [
    ("nvio", "NvioFile", "nvio.io:BufferedIO"),
    ("nvio.io", "NvioFile", "BufferedIO"),
    ("nvio.safetensors", "stream", "iter_tensors"),
    ("nvio.offload", "stream_model", "run_from_disk"),
    ("nvio.offload", "unstream", "run_from_memory"),
    ("nvio.offload", "streamed", "running_from_disk"),
    ("nvio.offload", "StreamError", "WeightReadError"),
]


def _new(module, new):
    if ":" in new:
        mod, attr = new.split(":")
        return getattr(importlib.import_module(mod), attr)
    return getattr(module, new)


@pytest.fixture
def fresh(monkeypatch):
    """Each test sees every old name as not warned about yet."""
    monkeypatch.setattr(nvio._renamed, "_warned", set())


def _needs(modname):
    if modname in ("nvio.safetensors", "nvio.offload"):
        pytest.importorskip("torch")
    return importlib.import_module(modname)


@pytest.mark.parametrize("modname,old,new", RENAMED, ids=["%s.%s" % (m, o) for m, o, _ in RENAMED])
def test_old_name_is_the_new_object_and_warns_once_at_the_caller(fresh, modname, old, new):
    mod = _needs(modname)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = getattr(mod, old)
        again = getattr(mod, old)
    assert got is _new(mod, new) and again is got
    assert len(w) == 1, [str(x.message) for x in w]
    assert issubclass(w[0].category, DeprecationWarning)
    assert w[0].filename == __file__, w[0].filename       # stacklevel: the caller's line
    shown = new.replace(":", ".") if ":" in new else "%s.%s" % (modname, new)
    assert str(w[0].message) == "%s.%s is deprecated (nvio 0.3): use %s" % (modname, old, shown)


@pytest.mark.parametrize("modname,old,new", RENAMED, ids=["%s.%s" % (m, o) for m, o, _ in RENAMED])
def test_from_import_of_an_old_name_works_and_warns(fresh, modname, old, new):
    mod = _needs(modname)
    ns = {}
    with pytest.warns(DeprecationWarning, match=re.escape("%s.%s is deprecated" % (modname, old))):
        exec("from %s import %s as got" % (modname, old), ns)
    assert ns["got"] is _new(mod, new)


@pytest.mark.parametrize("modname", sorted({m for m, _, _ in RENAMED}))
def test_old_names_are_not_offered(modname):
    """import * and dir() give only the new names; an unknown name is
    still an AttributeError naming it."""
    mod = _needs(modname)
    olds = {o for m, o, _ in RENAMED if m == modname}
    assert not olds & set(mod.__all__)
    assert not olds & set(dir(mod))
    ns = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec("from %s import *" % modname, ns)
    assert not olds & set(ns)
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(mod, "no_such_name")


def test_nvio_lazy_names_still_work():
    pytest.importorskip("torch")
    import nvio.checkpoint
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert nvio.save is nvio.checkpoint.save and nvio.CheckpointError is nvio.checkpoint.CheckpointError


def test_buffered_io_round_trip_old_and_new_names(fresh, tmp_path):
    data = pattern(3 << 20, 5)
    p = tmp_path / "f.bin"
    with nvio.open(p, "wb") as f:
        assert type(f) is nvio.io.BufferedIO
        assert repr(f).startswith("<nvio.io.BufferedIO name=")
        f.write(data)
    with pytest.warns(DeprecationWarning):
        old = nvio.NvioFile
    with nvio.open(p, "rb") as f:
        assert isinstance(f, old) and isinstance(f, nvio.io.BufferedIO)
        assert f.read() == data
    # nvio.File is the open file of a handle; BufferedIO wraps one
    h = nvio.AioHandle()
    try:
        with h.open(str(p), nvio.FILE_READ) as fh:
            assert isinstance(fh, nvio.File)
            got = bytearray(len(data))
            assert fh.pread(got, 0) == len(data) and got == data
    finally:
        h.close()


def test_iter_tensors_and_its_old_name_read_the_same_bytes(fresh, tmp_path):
    torch = pytest.importorskip("torch")
    import nvio.safetensors as nst
    sd = {"a": torch.arange(1000, dtype=torch.int32),
          "b": torch.frombuffer(bytearray(pattern(70001, 3)), dtype=torch.uint8)}
    p = str(tmp_path / "m.safetensors")
    nst.save_file(sd, p)
    new = [(k, bytes(t.numpy().tobytes())) for k, t in nst.iter_tensors(p, window_bytes=4096)]
    with pytest.warns(DeprecationWarning):
        old_fn = nst.stream
    old = [(k, bytes(t.numpy().tobytes())) for k, t in old_fn(p, window_bytes=4096)]
    want = [(k, sd[k].numpy().tobytes()) for k in ("a", "b")]
    assert new == want and old == want
    with pytest.raises(ValueError, match="nvio.safetensors.iter_tensors: window_bytes"):
        list(nst.iter_tensors(p, window_bytes=1))


def test_weight_read_error_is_caught_by_the_old_name(fresh):
    pytest.importorskip("torch")
    import nvio.offload as off
    with pytest.warns(DeprecationWarning):
        old = off.StreamError
    with pytest.raises(old):
        raise off.WeightReadError(5, "x")
    assert issubclass(off.WeightReadError, OSError)


def test_run_from_disk_and_its_old_names_give_the_same_outputs(fresh, tmp_path, engine):
    """The model run from disk by the new names and by the old ones computes
    what it computes in memory; its runner is model._nvio_from_disk, and
    _nvio_streamer (0.2's documented name) is the same object; both go
    when the model is back in memory."""
    torch = pytest.importorskip("torch")
    import nvio.offload as off
    from torch import nn
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), *[nn.Linear(16, 16) for _ in range(4)], nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        ref = m(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = (off.stream_model, off.unstream, off.streamed)
    for run, back, ctx in ((off.run_from_disk, off.run_from_memory, off.running_from_disk), old):
        assert run(m, str(tmp_path), engine=engine) is m
        assert m._nvio_from_disk is m._nvio_streamer
        assert [b.name for b in m._nvio_from_disk.blocks] == [str(i) for i in range(6)]
        assert m[2].weight.device.type == "meta"
        with torch.no_grad():
            assert torch.equal(m(x), ref)
        assert m._nvio_from_disk.stats()["block_reads"] >= 6
        with pytest.raises(RuntimeError, match="runs from disk already"):
            run(m, str(tmp_path), engine=engine)
        back(m)
        assert not hasattr(m, "_nvio_from_disk") and not hasattr(m, "_nvio_streamer")
        with pytest.raises(ValueError, match="not run from disk"):
            back(m)
        with ctx(m, str(tmp_path), engine=engine) as mm, torch.no_grad():
            assert mm is m and torch.equal(m(x), ref)
        assert not hasattr(m, "_nvio_from_disk")
        with torch.no_grad():
            assert torch.equal(m(x), ref)


# --- each word, one meaning ---------------------------------------------------

# Types named File that are other projects' names (DCP's, DeepSpeed's and
# Python's exceptions, which nvio's errors derive from).
FILE_OK = {"File", "FileSystemWriter", "FileSystemReader", "FastFileWriter",
           "FastFileWriterConfig", "MockFileWriter", "PyFileWriter",
           "NvioFileNotFoundError", "NvioFileExistsError"}


def _public_names():
    pytest.importorskip("torch")
    mods = ["nvio", "nvio.io", "nvio.handles", "nvio.safetensors", "nvio.offload",
            "nvio.checkpoint", "nvio.data", "nvio.compat", "nvio.dcp", "nvio.integrations"]
    for m in mods:
        mod = importlib.import_module(m)
        for name in getattr(mod, "__all__", ()):
            yield m, name


#: Names with "handle": libnvio's handle type, DeepNVMe's handle classes and
#: their factories, and checkpoint's default (throughput) handle.
HANDLE_OK = {"Handle", "AioHandle", "GdsHandle", "aio_handle", "gds_handle", "default_handle"}


def test_file_stream_compat_and_handle_each_name_one_thing():
    """A public name that says File is nvio.File (or another project's own
    name); one that says stream is nvio.Stream; compat is nvio.compat; a
    handle is a libnvio handle."""
    bad = []
    for m, name in _public_names():
        if "handle" in name.lower() and name not in HANDLE_OK:
            bad.append("%s.%s (handle)" % (m, name))
        if "File" in name and name not in FILE_OK:       # a type (file_size is no type)
            bad.append("%s.%s (File)" % (m, name))
        if "stream" in name.lower() and name != "Stream":
            bad.append("%s.%s (stream)" % (m, name))
        if "compat" in name.lower():
            bad.append("%s.%s (compat)" % (m, name))
    assert not bad, bad
    assert nvio.File.__mro__[1] is nvio._nvio.File
    assert nvio.Stream is nvio._nvio.Stream
    assert issubclass(nvio.GdsHandle, nvio.AioHandle) and issubclass(nvio.AioHandle, nvio.Handle)


def test_the_old_abis_file_is_not_called_compat():
    """libnvio's 0.1/0.2 layouts live in src/abi_old.c: in nvio "compat"
    means nvio.compat (DeepSpeed's names) only."""
    src = os.listdir(os.path.join(ROOT, "src"))
    assert "abi_old.c" in src
    assert not [f for f in src if "compat" in f]
