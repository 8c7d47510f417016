"""The handle's API surface: constructor, getters, signatures, module functions."""
import inspect
import os

import pytest

import nvio
from nvio_testutil import pattern


def test_defaults_match_deepspeed():
    h = nvio.aio_handle()
    assert nvio.aio_handle is nvio.AioHandle
    assert h.get_block_size() == 1048576
    assert h.get_queue_depth() == 128
    assert h.get_single_submit() is False
    assert h.get_overlap_events() is False
    assert h.get_intra_op_parallelism() == 1
    assert h.get_engine() in ("io_uring", "libaio", "psync")
    assert h.get_direct() == "auto"
    assert isinstance(h.get_engine_note(), str)
    cfg = h.get_config()
    assert cfg["block_size"] == 1048576 and cfg["engine"] == h.get_engine()
    h.close()


def test_positional_and_keyword_construction():
    h = nvio.AioHandle(65536, 16, True, True, 3)
    assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(),
            h.get_overlap_events(), h.get_intra_op_parallelism()) == (65536, 16, True, True, 3)
    h2 = nvio.AioHandle(block_size=131072, queue_depth=8, single_submit=False,
                        overlap_events=True, intra_op_parallelism=2)
    assert h2.get_block_size() == 131072 and h2.get_overlap_events() is True


def test_engine_and_direct_arguments(engine):
    for direct, name in ((True, "on"), (False, "off"), ("auto", "auto"), (None, "auto"),
                         ("on", "on"), ("off", "off")):
        with nvio.AioHandle(engine=engine, direct=direct) as h:
            assert h.get_engine() == engine
            assert h.get_direct() == name


def test_unavailable_engine_is_an_error():
    for e in nvio.ENGINES:
        ok, why = nvio.engine_available(e)
        assert isinstance(ok, bool) and isinstance(why, str)
        if not ok:
            assert why
            with pytest.raises(OSError):
                nvio.AioHandle(engine=e)
    assert "psync" in nvio.available_engines()


def test_signatures_visible_to_help():
    sig = inspect.signature(nvio.AioHandle)
    assert list(sig.parameters)[:5] == ["block_size", "queue_depth", "single_submit",
                                        "overlap_events", "intra_op_parallelism"]
    assert sig.parameters["block_size"].default == 1048576
    assert "engine" in sig.parameters and "direct" in sig.parameters
    h = nvio.AioHandle()
    p = inspect.signature(h.pread)
    assert list(p.parameters)[:5] == ["buffer", "filename", "validate", "async_op",
                                      "file_offset"]
    assert p.parameters["file_offset"].default == 0
    assert list(inspect.signature(h.sync_pwrite).parameters)[:3] == [
        "buffer", "filename", "file_offset"]
    assert list(inspect.signature(h.wait).parameters) == []
    text = pydoc_text(nvio.AioHandle)
    assert "pread(self, /, buffer, filename, validate=False, async_op=False, file_offset=0" in text
    assert "new_cpu_locked_tensor(self, num_elem, example_tensor, *, allow_unlocked=False)" in text


def pydoc_text(obj):
    import pydoc
    return pydoc.render_doc(obj, renderer=pydoc.plaintext)


def test_tuned(tmp_path, monkeypatch):
    monkeypatch.setenv("NVIO_TUNED_FILE", str(tmp_path / "tuned.conf"))
    monkeypatch.delenv("NVIO_NO_TUNED", raising=False)
    d = str(tmp_path)
    h = nvio.AioHandle.tuned(d)                       # nothing saved: defaults
    assert h.get_block_size() == 1048576
    src = nvio.AioHandle(block_size=262144, queue_depth=16, intra_op_parallelism=2,
                         overlap_events=True, engine="psync")
    src.save_tuned(d, for_write=True)
    assert nvio.load_tuned(d, for_write=True)["block_size"] == 262144
    assert nvio.load_tuned(d, for_write=False) is None
    w = nvio.AioHandle.tuned(d, for_write=True)
    assert (w.get_block_size(), w.get_queue_depth(), w.get_intra_op_parallelism(),
            w.get_overlap_events(), w.get_engine()) == (262144, 16, 2, True, "psync")
    o = nvio.AioHandle.tuned(d, True, queue_depth=4)
    assert o.get_queue_depth() == 4 and o.get_block_size() == 262144
    monkeypatch.setenv("NVIO_NO_TUNED", "1")
    assert nvio.AioHandle.tuned(d, True).get_block_size() == 1048576


def test_environment_overrides_engine(monkeypatch):
    monkeypatch.setenv("NVIO_ENGINE", "psync")
    with nvio.AioHandle(engine="auto") as h:
        assert h.get_engine() == "psync"


def test_module_functions(tmp_path):
    assert nvio.__version__ == nvio.version() and nvio.version().count(".") == 2
    assert nvio._nvio.VERSION_NUM == nvio._nvio.HEADER_VERSION_NUM
    p = nvio.probe(str(tmp_path))
    assert set(p["engines"]) == {"io_uring", "libaio", "psync"}
    assert p["engines"]["psync"][0] is True
    assert nvio.probe()["fs_type"] == ""
    (tmp_path / "f").write_bytes(b"12345")
    assert nvio.file_size(str(tmp_path / "f")) == 5
    with pytest.raises(FileNotFoundError):
        nvio.file_size(str(tmp_path / "missing"))
    assert "No such file" in nvio.strerror(2)
    addr, n = nvio.buffer_info(bytearray(7))
    assert n == 7 and addr


def test_exception_hierarchy():
    assert issubclass(nvio.NvioError, OSError)
    assert issubclass(nvio.NvioFileNotFoundError, FileNotFoundError)
    assert issubclass(nvio.NvioFileNotFoundError, nvio.NvioError)
    assert issubclass(nvio.NvioPermissionError, PermissionError)
    assert issubclass(nvio.NvioIsADirectoryError, IsADirectoryError)


def test_permission_and_directory_errors(np, tmp_path):
    import os
    a = np.zeros(4, np.uint8)
    with nvio.AioHandle() as h:
        with pytest.raises(IsADirectoryError) as ei:
            h.sync_pread(a, str(tmp_path))
        assert isinstance(ei.value, nvio.NvioError)
        if os.geteuid() != 0:
            f = tmp_path / "noperm"
            f.write_bytes(b"1234")
            f.chmod(0)
            with pytest.raises(PermissionError):
                h.sync_pread(a, str(f))


def test_duck_typed_tensors(handle, tmp_path):
    """Objects with a tensor's methods work without torch: one that says
    is_cpu, one that only has a device, and the same types again (nvio
    remembers which types look like tensors)."""
    import ctypes

    class Dev:
        type = "cpu"

    class Base:
        def __init__(self, mem):
            self.mem = mem

        def data_ptr(self):
            return ctypes.addressof(self.mem)

        def numel(self):
            return len(self.mem) // 4

        def element_size(self):
            return 4

        def is_contiguous(self):
            return True

    class CpuFlag(Base):
        is_cpu = True

    class DeviceOnly(Base):
        device = Dev()

    class NotContiguous(CpuFlag):
        def is_contiguous(self):
            return False

    f = str(tmp_path / "duck.bin")
    data = pattern(4096, 7)
    with open(f, "wb") as fh:
        fh.write(data)
    for rnd in range(2):
        for cls in (CpuFlag, DeviceOnly):
            mem = (ctypes.c_char * 4096)()
            t = cls(mem)
            assert nvio.buffer_info(t) == (ctypes.addressof(mem), 4096)
            handle.sync_pread(t, f)
            assert bytes(mem) == data, (cls.__name__, rnd)
        with pytest.raises(ValueError, match="contiguous"):
            handle.sync_pread(NotContiguous(mem), f)

    # methods on the instance, not the type (a proxy)
    import types
    mem = (ctypes.c_char * 4096)()
    ns = types.SimpleNamespace(
        is_cpu=True, data_ptr=lambda: ctypes.addressof(mem),
        numel=lambda: 1024, element_size=lambda: 4, is_contiguous=lambda: True)
    handle.sync_pread(ns, f)
    assert bytes(mem) == data

    class Broken(CpuFlag):                   # errors propagate as they are
        @property
        def is_cpu(self):
            raise RuntimeError("device lost")

    with pytest.raises(RuntimeError, match="device lost"):
        handle.sync_pread(Broken(mem), f)


def test_stub_names_every_export_of_the_extension():
    """_nvio.pyi (installed beside the extension) declares what it exports."""
    import ast
    import os
    from nvio import _nvio
    stub = os.path.join(os.path.dirname(nvio.__file__), "_nvio.pyi")
    tree = ast.parse(open(stub).read())
    top = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    top |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    missing = [k for k in dir(_nvio) if not k.startswith("_") and k not in top]
    assert not missing, missing
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for cls in ("Handle", "File", "Stream"):
        declared = {n.name for n in classes[cls].body if isinstance(n, ast.FunctionDef)}
        real = {k for k in dir(getattr(_nvio, cls)) if not k.startswith("_")}
        assert real <= declared, (cls, sorted(real - declared))


_STAGING_BUDGET = r"""
import sys
import numpy as np
import nvio
nvio.staging_set_limit(8 << 20)
limit, in_use = nvio.staging_limit()
assert limit == 8 << 20 and in_use == 0, (limit, in_use)
data = np.random.default_rng(1).integers(0, 255, (4 << 20) + 7, dtype=np.uint8)
p = sys.argv[1]
with open(p, "wb") as f:
    f.write(data.tobytes())
hs = [nvio.AioHandle(intra_op_parallelism=2) for _ in range(3)]
for h in hs:
    out = np.zeros(len(data) + 1, dtype=np.uint8)
    h.sync_pread(out[1:], p)          # unaligned: staged when direct
    assert np.array_equal(out[1:], data)
_, in_use = nvio.staging_limit()
assert in_use <= (8 << 20) + 3 * 2 * 2 * (1 << 20), in_use
for h in hs:
    h.close()
assert nvio.staging_limit()[1] == 0, nvio.staging_limit()
nvio.staging_set_limit(0)
assert nvio.staging_limit()[0] == 512 << 20, nvio.staging_limit()
print("ok")
"""


def test_staging_budget_is_process_wide_and_settable(tmp_path):
    """Bounce pools of every handle draw from one limit; destroy gives back.

    The budget is the process's, so this runs in a process of its own: in
    the test process other handles may hold pools on purpose (the
    applications' default handle keeps its pool for the process's life
    once a safetensors/checkpoint call made it), and in_use counts them."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "NVIO_STAGING_LIMIT"}
    r = subprocess.run([sys.executable, "-c", _STAGING_BUDGET, str(tmp_path / "d.bin")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_cufile_set_library_is_taken_and_probe_does_not_hide_it():
    mode, why = nvio.gds_mode()
    if mode != "none":
        pytest.skip("a real cuFile is loaded here")
    nvio.cufile_set_library("/nonexistent/libcufile.so.0")
    assert nvio.gds_mode()[0] == "none"          # still looked for, not found
    nvio.cufile_set_library(None)
