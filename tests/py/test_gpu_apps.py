"""nvio's applications on CUDA tensors, on every engine, through AioHandle
(bounce buffers) and GdsHandle (cuFile): nvio.load(map_location="cuda"),
nvio.safetensors.load_file(device="cuda"), and nvio.save / async_save of a
state whose storages are in device memory.

With a usable CUDA device in torch the results are CUDA tensors. Without
one (CI, torch's CPU build) the simulated driver (tests/sim/, loaded by
gpusim) stands in: gpusim.TorchProvider, installed as nvio._device's
provider, gives the applications CPU torch storages over simulated device
memory (a host access faults), which libnvio finds to be device memory
through the simulated driver and fills through its GPU paths. The bytes
are then read back through the simulator's back door and compared, storage
by storage, with what torch.load reads to the CPU.

Saves start from a state copied into device memory (the back door again);
the file must hold what torch.save writes of the same values on the CPU
(every tensor, every data record's bytes, every CRC-32), with cuda:0 as
the storages' location. The simulator's counters show how the bytes left
device memory: libnvio's bounce copies (AioHandle) or cuFile writes
(GdsHandle); the provider counts the device-to-host copies it makes for
the application (torch's copies on a GPU: CRC-32s, async snapshots). A
host read of device memory would fault, and a back-door copy standing in
for the device path leaves the counters still.
"""
import gc
import os

import pytest

torch = pytest.importorskip("torch")

import gpusim  # noqa: E402
import nvio  # noqa: E402
from nvio import _device  # noqa: E402
from nvio import safetensors as nst  # noqa: E402

REAL = torch.cuda.is_available()
HANDLES = [nvio.AioHandle, nvio.GdsHandle]


class Real:
    def bytes(self, s):
        return bytes(torch.empty(0, dtype=torch.uint8).set_(s.cpu()).numpy())

    def on_device(self, s):
        return s.device.type == "cuda"

    def moved(self, cls):
        return None

    def check_clean(self):
        pass

    def counters(self):
        return None

    def storage(self, host):
        return host.cuda()


class Simulated:
    def __init__(self):
        self.sim = gpusim.load()
        self.provider = gpusim.TorchProvider(self.sim)

    def bytes(self, s):
        return self.provider.bytes(s)

    def on_device(self, s):
        return self.provider.owns(s)

    def moved(self, cls):
        """Driver copies (bounce path) and cuFile calls so far. (GdsHandle
        moves a vectored read of several buffers, as nvio.load makes, through
        the bounce path too: cuFile takes one buffer per call.)"""
        return self.sim.copies() + self.sim.cufile_ios()

    def check_clean(self):
        assert self.sim.violations() == 0

    def counters(self):
        """(copies libnvio made through the driver, copies to the host the
        provider made for the application as torch would, cuFile I/Os)."""
        d2h = self.provider.d2h
        return self.sim.copies() - d2h, d2h, self.sim.cufile_ios()

    def storage(self, host):
        """A device storage holding a host storage's bytes (written through
        the simulator's back door)."""
        n = host.nbytes()
        s = self.provider.empty(n, torch.device("cuda"))
        if n:
            import ctypes
            assert self.sim.cuda.sim_cuda_poke(ctypes.c_void_p(s.data_ptr()),
                                               ctypes.c_void_p(host.data_ptr()), n) == 0
        return s


@pytest.fixture(scope="module")
def gpu():
    if REAL:
        yield Real()
        return
    g = Simulated()
    old = _device._set_provider(g.provider)
    yield g
    _device._set_provider(old)


def host_bytes(s):
    return bytes(torch.empty(0, dtype=torch.uint8).set_(s).numpy())


def state():
    g = torch.Generator().manual_seed(23)
    big = torch.randn(300_001, generator=g)                     # 1.2 MiB, blocks of 1 MiB
    mat = torch.randint(-1000, 1000, (129, 67), dtype=torch.int32, generator=g)
    return {
        "big": big,
        "head": big[:1000],                                     # a view sharing big's storage
        "mat_t": mat.t(),                                       # not contiguous
        "bf16": torch.randn(4097, generator=g).to(torch.bfloat16),
        "u8": torch.randint(0, 256, (3,), dtype=torch.uint8, generator=g),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 5),
        "nested": {"step": 7, "ids": torch.arange(5)},
    }


def tensors(obj, prefix=""):
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors(v, prefix + "/" + str(k))


def check_same(gpu, got, want):
    """Every tensor: same dtype, shape, strides and offset, its storage in
    device memory holding the bytes torch.load read; shared storages stay
    shared."""
    g, w = dict(tensors(got)), dict(tensors(want))
    assert g.keys() == w.keys()
    ptrs = {}
    for k, t in g.items():
        r = w[k]
        assert (t.dtype, t.shape, t.stride(), t.storage_offset()) == \
            (r.dtype, r.shape, r.stride(), r.storage_offset()), k
        s, rs = t.untyped_storage(), r.untyped_storage()
        assert s.nbytes() == rs.nbytes(), k
        if s.nbytes():
            assert gpu.on_device(s), k
            assert gpu.bytes(s) == host_bytes(rs), k
        ptrs.setdefault(rs.data_ptr(), set()).add(s.data_ptr())
    assert all(len(v) == 1 for v in ptrs.values())     # shared stays shared
    assert not isinstance(got.get("nested"), torch.Tensor) and got["nested"]["step"] == 7


def failure(fn):
    """(errno, message) of the OSError fn raises; the traceback (and the
    storages its frames hold) is dropped."""
    try:
        fn()
    except OSError as e:
        return e.errno, str(e)
    raise AssertionError("no error")


@pytest.mark.parametrize("cls", HANDLES)
@pytest.mark.parametrize("map_location", ["cuda", {"cpu": "cuda"}], ids=["str", "dict"])
@pytest.mark.parametrize("weights_only", [True, False], ids=["weights", "full"])
def test_load_to_cuda(gpu, cls, engine, map_location, weights_only, tmp_path):
    path = str(tmp_path / "s.pt")
    sd = state()
    nvio.save(sd, path)
    want = torch.load(path, weights_only=True)
    with cls(engine=engine) as h:
        moved = gpu.moved(cls)
        got = nvio.load(path, map_location=map_location, weights_only=weights_only,
                        handle=h, verify=True)
        if moved is not None:
            assert gpu.moved(cls) > moved     # the device path, not a host copy
        check_same(gpu, got, want)
    gpu.check_clean()


def test_torch_save_file_to_cuda_default_handle(gpu, tmp_path):
    path = str(tmp_path / "t.pt")
    torch.save(state(), path)
    want = torch.load(path, weights_only=True)
    check_same(gpu, nvio.load(path, map_location="cuda"), want)
    gpu.check_clean()


def st_state():
    g = torch.Generator().manual_seed(5)
    return {"w": torch.randn(513, 1025, generator=g),          # 2 MiB
            "b": torch.randn(1025, generator=g).to(torch.float16),
            "i": torch.arange(7, dtype=torch.int64),
            "z": torch.empty(0, 3),
            "s": torch.tensor(1.5)}


@pytest.mark.parametrize("cls", HANDLES)
@pytest.mark.parametrize("copy", [False, True], ids=["runs", "owned"])
def test_safetensors_load_file_to_cuda(gpu, cls, engine, copy, tmp_path):
    from safetensors.torch import load_file as st_load
    path = str(tmp_path / "m.safetensors")
    nst.save_file(st_state(), path)
    want = st_load(path)
    with cls(engine=engine) as h:
        moved = gpu.moved(cls)
        got = nst.load_file(path, device="cuda", copy=copy, handle=h)
        if moved is not None:
            assert gpu.moved(cls) > moved
    assert list(got) == list(want)
    for k, t in got.items():
        r = want[k]
        assert (t.dtype, t.shape) == (r.dtype, r.shape), k
        if r.numel():
            assert gpu.on_device(t.untyped_storage()), k
            assert t.is_contiguous()
            # the tensor's own bytes, at its offset in its (maybe shared) storage
            whole = gpu.bytes(t.untyped_storage())
            off = t.storage_offset() * t.element_size()
            assert whole[off:off + r.nbytes] == host_bytes(r.contiguous().untyped_storage())[:r.nbytes], k
    gpu.check_clean()


@pytest.mark.skipif(REAL, reason="failures are injected into the simulator")
@pytest.mark.parametrize("how", ["cuMemcpyHtoDAsync_v2", "copy"])
def test_driver_failure_is_an_error_and_leaks_nothing(gpu, how, engine, tmp_path):
    pt, st = str(tmp_path / "f.pt"), str(tmp_path / "f.safetensors")
    nvio.save(state(), pt)
    nst.save_file(st_state(), st)
    gc.collect()
    before = gpu.provider.allocations()
    with nvio.AioHandle(engine=engine) as h:
        for path, fn in ((pt, lambda: nvio.load(pt, map_location="cuda", handle=h)),
                         (st, lambda: nst.load_file(st, device="cuda", handle=h))):
            gpu.sim.fail(how, 0, 1, 999)
            errno, msg = failure(fn)
            assert errno == 5 and path in msg, msg
            gc.collect()
            assert gpu.provider.allocations() == before     # no device memory left behind
        # the handle goes on: the same loads succeed afterwards
        check_same(gpu, nvio.load(pt, map_location="cuda", handle=h),
                   torch.load(pt, weights_only=True))
    gc.collect()
    assert gpu.provider.allocations() == before
    gpu.check_clean()


# --- saving from device memory ------------------------------------------------


def on_device(gpu, obj, _done=None):
    """obj with every tensor's storage copied to device memory; tensors that
    share a storage share its copy (views, offsets and strides kept)."""
    done = {} if _done is None else _done
    if isinstance(obj, torch.Tensor):
        s = obj.untyped_storage()
        key = (s.data_ptr(), s.nbytes())
        if key not in done:
            done[key] = gpu.storage(s)
        dev = torch.empty(0, dtype=obj.dtype, device=done[key].device)
        return dev.set_(done[key], obj.storage_offset(), obj.shape, obj.stride())
    if isinstance(obj, dict):
        return {k: on_device(gpu, v, done) for k, v in obj.items()}
    return obj


def device_storages(obj):
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for _, t in tensors(obj) if t.untyped_storage().nbytes()}


def check_saved(path, ref):
    """The checkpoint nvio wrote from device memory holds what torch.save
    wrote of the same values on the CPU: every tensor (loaded by
    torch.load), every data record's bytes (read by zipfile, which checks
    their CRC-32), and a CUDA location for every storage, as torch.save
    records for CUDA tensors."""
    import zipfile
    locs = []

    def keep(s, loc):
        if s.nbytes():      # (the simulator has no empty device storages)
            locs.append(loc)
        return s
    got = torch.load(path, map_location=keep, weights_only=True)
    want = torch.load(ref, weights_only=True)
    g, w = dict(tensors(got)), dict(tensors(want))
    assert g.keys() == w.keys()
    for k, t in g.items():
        r = w[k]
        assert (t.dtype, t.shape, t.stride(), t.storage_offset()) == \
            (r.dtype, r.shape, r.stride(), r.storage_offset()), k
        assert torch.equal(t, r), k
    assert got["nested"]["step"] == 7
    assert g["/head"].untyped_storage().data_ptr() == g["/big"].untyped_storage().data_ptr()
    assert locs and set(locs) == {"cuda:0"}, locs

    def records(p):
        with zipfile.ZipFile(p) as z:
            return {n.split("/", 1)[1]: z.read(n) for n in z.namelist()
                    if n.split("/", 1)[1].startswith("data/")}
    got_r, want_r = records(path), records(ref)
    assert got_r.keys() == want_r.keys() and len(got_r) == 7
    for name in want_r:
        assert got_r[name] == want_r[name], name
    # nvio's reader checks every CRC-32 too
    nvio.load(path, map_location="cpu", verify=True)


def check_device_path(gpu, cls, before, nstorages):
    """The tensor bytes left device memory through libnvio: its bounce
    copies (AioHandle) or cuFile writes (GdsHandle, one per storage), not
    a host copy made by the application."""
    if before is None:
        return
    nv, d2h, io = (b - a for a, b in zip(before, gpu.counters()))
    if cls is nvio.GdsHandle:
        assert io >= nstorages, (nv, d2h, io)
    else:
        assert nv >= nstorages and io == 0, (nv, d2h, io)
    # the CRC-32s: one chunked copy per storage, as torch's copy would be
    assert d2h >= nstorages, (nv, d2h, io)


@pytest.mark.parametrize("cls", HANDLES)
def test_save_from_cuda(gpu, cls, engine, tmp_path):
    sd = state()
    dsd = on_device(gpu, sd)
    ref, path = str(tmp_path / "ref.pt"), str(tmp_path / "dev.pt")
    torch.save(sd, ref)
    n = len(device_storages(dsd))
    with cls(engine=engine) as h:
        before = gpu.counters()
        nvio.save(dsd, path, handle=h)
        check_device_path(gpu, cls, before, n)
    check_saved(path, ref)
    gpu.check_clean()


@pytest.mark.parametrize("cls", HANDLES)
def test_async_save_from_cuda(gpu, cls, engine, tmp_path):
    """async_save snapshots device storages into its host pool by
    device-to-host copies (one per storage), then writes the host image."""
    sd = state()
    dsd = on_device(gpu, sd)
    ref, path = str(tmp_path / "ref.pt"), str(tmp_path / "dev.pt")
    torch.save(sd, ref)
    n = len(device_storages(dsd))
    with cls(engine=engine) as h, nvio.AsyncCheckpointer(handle=h) as ck:
        before = gpu.counters()
        fut = ck.save(dsd, path)
        if before is not None:
            assert gpu.counters()[1] - before[1] == n   # snapshot taken before return
        assert fut.result() == os.path.getsize(path)
    check_saved(path, ref)
    gpu.check_clean()


@pytest.mark.skipif(REAL, reason="failures are injected into the simulator")
@pytest.mark.parametrize("how", ["cuMemcpyDtoHAsync_v2", "copy", "cuMemcpyDtoH_v2"])
def test_save_from_cuda_driver_failure(gpu, how, engine, tmp_path):
    """A device copy failing fails the save, and the file keeps its old
    content; the handle goes on. libnvio's bounce copies
    (cuMemcpyDtoHAsync) fail it with EIO naming the file; a copy for a
    CRC-32 (torch's on a GPU, cuMemcpyDtoH) with torch's error, here the
    provider's RuntimeError; "copy" fails whichever copy runs first."""
    path = str(tmp_path / "dev.pt")
    with open(path, "wb") as f:
        f.write(b"old")
    dsd = on_device(gpu, state())
    with nvio.AioHandle(engine=engine) as h:
        gpu.sim.fail(how, 0, 1, 999)
        try:
            nvio.save(dsd, path, handle=h)
            raise AssertionError("no error")
        except OSError as e:
            assert how != "cuMemcpyDtoH_v2" and e.errno == 5 and path in str(e), e
        except RuntimeError as e:
            assert how != "cuMemcpyDtoHAsync_v2" and "cuMemcpyDtoH" in str(e), e
        assert open(path, "rb").read() == b"old"
        assert sorted(os.listdir(tmp_path)) == ["dev.pt"]
        nvio.save(dsd, path, handle=h)
    ref = str(tmp_path / "ref.pt")
    torch.save(state(), ref)
    check_saved(path, ref)
    gpu.check_clean()
