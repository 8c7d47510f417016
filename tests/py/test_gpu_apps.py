"""nvio's applications on CUDA tensors, on every engine, through AioHandle
(bounce buffers) and GdsHandle (cuFile): nvio.load(map_location="cuda");
nvio.save / async_save of a state whose storages are in device memory; in
nvio.safetensors load_file, safe_open (get_tensor, get_slice, get_tensors),
load_model_dir and stream of a sharded directory, load_into a module whose
tensors are in device memory, all with device="cuda", and save_file / save
of tensors in device memory; nvio.offload.run_from_disk(device="cuda") (the
copies to the device, slot reuse, the events ordering them); the offload
Swapper's swap_out / swap_in of device tensors; nvio.dcp's FileSystemWriter
(dcp.save and dcp.async_save of device tensors, files equal to a CPU save's)
and FileSystemReader (dcp.load into device destinations).

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
for the device path leaves the counters still. safetensors save_file
writes device tensors with no copy for the application at all (the format
has no CRC), and its file must equal the safetensors library's, byte for
byte.

run_from_disk's blocks cannot compute on simulated memory (see the section
below): they read their weights on the "current stream" instead.

What the simulator cannot prove: work that needs torch's CUDA kernels on
the data (a forward pass, dtype conversions in load_into, a misaligned
tensor in a foreign safetensors file, which is copied, nvio.dcp's clone of
a strided device tensor that does not fill its storage and its copy into
a strided device destination, transformers'
from_pretrained on the loaded state), nor that torch's streams behave as
the simulated driver's (nvio._device.synchronize waits for the current
stream before a save; here nothing is queued on it).
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
    g.provider.close()


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


# --- safetensors beyond load_file -------------------------------------------


def tbytes(gpu, t):
    """The bytes of a tensor whose storage is in device memory, in C order
    (its storage read through the back door, viewed as the tensor views it)."""
    s = t.untyped_storage()
    if s.nbytes() == 0 or t.numel() == 0:
        return b""
    if not gpu.on_device(s):
        raise AssertionError("not in device memory")
    host = torch.frombuffer(bytearray(gpu.bytes(s)), dtype=torch.uint8).untyped_storage()
    return cpu_bytes(torch.empty(0, dtype=t.dtype).set_(host, t.storage_offset(),
                                                         t.shape, t.stride()))


def cpu_bytes(t):
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def same(gpu, t, want, what):
    """A device tensor holds a CPU tensor's bytes. (Compared here, not in
    the caller's assert: pytest would print the device tensor, and reading
    it faults.)"""
    got, ref = tbytes(gpu, t), cpu_bytes(want)
    assert len(got) == len(ref), what
    assert got == ref, (what, next(i for i in range(len(got)) if got[i] != ref[i]))


def check_moved(gpu, before):
    """The bytes came through libnvio's device path (driver copies or
    cuFile), with no copy made for the application."""
    if before is None:
        return
    nv, d2h, io = (b - a for a, b in zip(before, gpu.counters()))
    assert nv + io > 0 and d2h == 0, (nv, d2h, io)


@pytest.mark.parametrize("cls", HANDLES)
def test_safe_open_to_cuda(gpu, cls, engine, tmp_path):
    from safetensors import safe_open as st_open
    path = str(tmp_path / "m.safetensors")
    nst.save_file(st_state(), path)
    with st_open(path, framework="pt") as ref:
        want = {k: ref.get_tensor(k) for k in ref.keys()}
    indexes = [(slice(None),), (slice(3, 300), slice(None)), (slice(None), slice(1, 1000, 7)),
               (5,), (Ellipsis, slice(2, 9)), (slice(10, 500, 3), 17)]
    with cls(engine=engine) as h, nst.safe_open(path, device="cuda", handle=h) as f:
        before = gpu.counters()
        for k in f.keys():
            t = f.get_tensor(k)
            assert (t.dtype, t.shape) == (want[k].dtype, want[k].shape), k
            same(gpu, t, want[k], k)
        check_moved(gpu, before)
        for ix in indexes:
            before = gpu.counters()
            got = f.get_slice("w")[ix]
            r = want["w"][ix]
            assert got.shape == r.shape, ix
            same(gpu, got, r, ix)
            check_moved(gpu, before)
        same(gpu, f.get_slice("b")[100:200], want["b"][100:200], "b")
        got = f.get_tensors()
        assert list(got) == f.offset_keys()
        for k, t in got.items():
            same(gpu, t, want[k], k)
    gpu.check_clean()


def model_dir(tmp_path):
    """A sharded Hugging Face directory: two shards and their index."""
    import json
    g = torch.Generator().manual_seed(9)
    shards = [{"a.w": torch.randn(300, 257, generator=g), "a.b": torch.randn(257, generator=g),
               "a.n": torch.arange(10, dtype=torch.int16)},
              {"b.w": torch.randn(129, 1000, generator=g).to(torch.bfloat16),
               "b.z": torch.empty(0, 4), "b.s": torch.tensor(3.25)}]
    d = tmp_path / "model"
    d.mkdir()
    wm = {}
    for i, sd in enumerate(shards):
        name = "model-%05d-of-00002.safetensors" % (i + 1)
        nst.save_file(sd, str(d / name))
        wm.update({k: name for k in sd})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return str(d), {k: v for sd in shards for k, v in sd.items()}


@pytest.mark.parametrize("cls", HANDLES)
def test_model_dir_and_stream_to_cuda(gpu, cls, engine, tmp_path):
    path, want = model_dir(tmp_path)
    with cls(engine=engine) as h:
        before = gpu.counters()
        got = nst.load_model_dir(path, device="cuda", handle=h)
        check_moved(gpu, before)
        assert sorted(got) == sorted(want)
        for k, t in got.items():
            assert (t.dtype, t.shape) == (want[k].dtype, want[k].shape), k
            same(gpu, t, want[k], k)
        del got
        before = gpu.counters()
        seen = []
        for k, t in nst.iter_tensors(path, window_bytes=256 << 10, device="cuda", handle=h):
            same(gpu, t, want[k], k)
            seen.append(k)
        assert sorted(seen) == sorted(want)
        check_moved(gpu, before)
    gpu.check_clean()


@pytest.mark.parametrize("cls", HANDLES)
def test_load_into_module_on_cuda(gpu, cls, engine, tmp_path):
    """load_into reads each tensor straight into the module's device memory
    (same dtype: no conversion, which would be a device kernel)."""
    path, want = model_dir(tmp_path)
    m = torch.nn.Module()
    for k, v in want.items():
        mod, name = k.split(".")
        if not hasattr(m, mod):
            setattr(m, mod, torch.nn.Module())
        dev = on_device(gpu, torch.full_like(v, 7))     # device memory, 7s at first
        getattr(m, mod).register_buffer(name, dev)
    with cls(engine=engine) as h:
        before = gpu.counters()
        missing, unexpected = nst.load_into(m, path, handle=h)
        check_moved(gpu, before)
    assert missing == [] and unexpected == []
    for k, t in m.state_dict().items():
        same(gpu, t, want[k], k)
    gpu.check_clean()


@pytest.mark.parametrize("cls", HANDLES)
def test_safetensors_save_from_cuda(gpu, cls, engine, tmp_path):
    """save_file from CUDA tensors writes the bytes the safetensors library
    writes of the same values on the CPU, straight from device memory (no
    copy to the host at all); save() copies them to the host."""
    from safetensors.torch import save as st_save
    sd = st_state()
    want = st_save(sd)
    dsd = on_device(gpu, sd)
    n = sum(1 for t in sd.values() if t.numel())
    path = str(tmp_path / "dev.safetensors")
    with cls(engine=engine) as h:
        before = gpu.counters()
        nst.save_file(dsd, path, handle=h)
        if before is not None:
            nv, d2h, io = (b - a for a, b in zip(before, gpu.counters()))
            assert d2h == 0, d2h
            assert (io >= n) if cls is nvio.GdsHandle else (nv >= n and io == 0), (nv, io)
    with open(path, "rb") as f:
        assert f.read() == want
    before = gpu.counters()
    assert nst.save(dsd) == want
    if before is not None:
        assert gpu.counters()[1] - before[1] == n
    gpu.check_clean()


# --- run_from_disk(device="cuda") ----------------------------------------------
#
# A forward pass cannot run on simulated device memory (torch's CPU kernels
# would read it and fault), so the blocks here do what a kernel does with
# its weights: read them on torch's current stream, as copies to the host
# queued there and checked once the stream is synchronised. The streamer's
# copies to the device (a side stream, from locked host slots), its
# events (the block waits for its copy; a slot's next copy waits for the
# block that used it; a host slot is refilled only after its copy ended)
# run on the simulator, whose copies are asynchronous with random delays:
# a missing wait gives wrong bytes here.


class Probe(torch.nn.Module):
    def __init__(self, i, rows, log):
        super().__init__()
        g = torch.Generator().manual_seed(100 + i)
        self.idx, self.log = i, log
        self.w = torch.nn.Parameter(torch.randn(rows, 97, generator=g), requires_grad=False)
        self.register_buffer("b", torch.randn(rows, generator=g).to(torch.float16))

    def forward(self, x):
        if self.log is not None:
            self.log.read(self.idx, "w", self.w)
            self.log.read(self.idx, "b", self.b)
        return x


class Model(torch.nn.Module):
    def __init__(self, log=None):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.embed = torch.nn.Parameter(torch.randn(33, 16, generator=g), requires_grad=False)
        self.layers = torch.nn.ModuleList([Probe(i, 40 + 30 * (i % 3), log) for i in range(5)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Reads:
    """What the blocks read of their weights, on the current stream."""

    def __init__(self, gpu):
        self.p = gpu.provider
        self.stream = self.p.current_stream(0)
        self.got = []

    def read(self, i, name, t):
        import ctypes
        n = t.numel() * t.element_size()
        buf = ctypes.create_string_buffer(n)
        self.p.copy_to_host_async(ctypes.addressof(buf), t.data_ptr(), n, self.stream)
        self.got.append((i, name, buf))

    def check(self, want):
        self.p.stream_synchronize(self.stream)
        assert self.got
        for i, name, buf in self.got:
            if buf.raw != cpu_bytes(want[i][name]):
                raise AssertionError("block %d read wrong bytes of %r" % (i, name))
        self.got = []


@pytest.mark.skipif(REAL, reason="the blocks read their weights through the simulator")
@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_run_from_disk_to_cuda(gpu, engine, prefetch, tmp_path):
    from nvio.offload import run_from_disk, run_from_memory
    want = {i: {"w": l.w.detach().clone(), "b": l.b.clone()} for i, l in enumerate(Model().layers)}
    embed = Model().embed.detach().clone()
    reads = Reads(gpu)
    m = Model(reads)
    gpu.sim.cuda.sim_cuda_set_delay(0, 1500)      # copies overtake each other often
    try:
        h2d, pageable = gpu.provider.h2d, gpu.sim.cuda.sim_cuda_pageable_copies()
        registered = gpu.sim.cuda.sim_cuda_host_registered()
        run_from_disk(m, str(tmp_path / "store"), device="cuda", prefetch=prefetch,
                     blocks="layers", engine=engine)
        st = m._nvio_from_disk.stats()
        assert st["device"] == "cuda:0" and st["slots"] == prefetch + 1
        same(gpu, m.embed, embed, "embed")     # resident: moved to the device
        with torch.no_grad():
            for _ in range(3):                   # the pool wraps around
                m(torch.zeros(1))
                reads.check(want)
        # a copy to the device per block run (or prefetched), each from
        # registered (page-locked) memory: the pageable copies are the
        # blocks' reads and the resident embed's move alone
        assert gpu.provider.h2d - h2d >= 3 * 5 - prefetch
        assert gpu.sim.cuda.sim_cuda_pageable_copies() - pageable == 3 * 5 * 2 + 1
        assert m._nvio_from_disk.stats()["block_reads"] >= 3 * 5 - prefetch - 1
        run_from_memory(m)
    finally:
        gpu.sim.cuda.sim_cuda_set_delay(0, 50)
    for i, layer in enumerate(m.layers):
        same(gpu, layer.w, want[i]["w"], (i, "w"))
        same(gpu, layer.b, want[i]["b"], (i, "b"))
    assert gpu.sim.cuda.sim_cuda_host_registered() == registered   # slots unregistered
    gpu.check_clean()


# --- the offload swapper -------------------------------------------------------


@pytest.mark.parametrize("cls", HANDLES)
def test_swapper_cuda_tensors(gpu, cls, engine, tmp_path):
    """swap_out of device tensors: one that fits the pool is copied into it
    (a device-to-host copy), one larger than the pool is written from device
    memory by libnvio; swap_in(out=device tensor) reads straight into
    device memory, or copies a key resident in the pool to it."""
    from nvio.offload import Swapper
    g = torch.Generator().manual_seed(4)
    small = torch.randn(3000, generator=g)                        # 12 KB
    big = torch.randn(300, 1000, generator=g).to(torch.bfloat16)  # 600 KB > the pool
    dsmall, dbig = on_device(gpu, small), on_device(gpu, big)
    d1, d2 = tmp_path / "a", tmp_path / "b"
    d1.mkdir()
    d2.mkdir()
    with cls(engine=engine) as h, Swapper([str(d1), str(d2)], 256 << 10, handle=h,
                                          stripe_min=64 << 10) as sw:
        c0 = gpu.counters()
        sw.swap_out("small", dsmall)
        if c0 is not None:
            assert gpu.counters()[1] - c0[1] == 1        # copied to the pool
        c0 = gpu.counters()
        sw.swap_out("big", dbig)
        check_moved(gpu, c0)                             # from device memory
        assert cpu_bytes(sw.swap_in("small")) == cpu_bytes(small)
        sw.release("small")
        out_small = on_device(gpu, torch.zeros_like(small))
        out_big = on_device(gpu, torch.zeros_like(big))
        for key, out, want in (("small", out_small, small), ("big", out_big, big)):
            c0 = gpu.counters()
            assert sw.swap_in(key, out) is out
            check_moved(gpu, c0)                         # straight into device memory
            same(gpu, out, want, key)
        # resident in the pool: copied from there to the device
        out2 = on_device(gpu, torch.zeros_like(small))
        sw.swap_in("small")
        before = getattr(gpu, "provider", None) and gpu.provider.h2d_sync
        sw.swap_in("small", out2)
        if before is not None:
            assert gpu.provider.h2d_sync - before == 1
        same(gpu, out2, small, "resident")
    gpu.check_clean()


# --- torch.distributed.checkpoint (nvio.dcp) --------------------------------
#
# DCP's planner hands nvio's writer the tensors as they are (it reads their
# sizes and dtypes, never their data: a host read of simulated device
# memory would fault), and nvio's reader the destinations the caller gave
# (narrowed views). What is nvio's is tested here: the writer's images of
# device tensors, written from device memory; the reader filling device
# destinations; async_save's stager copying them to the host.


def dcp_state():
    """Tensors DCP saves as items: a storage and a contiguous view of part
    of it (aliased: its image holds just its bytes), a transposed one
    (dense: its storage as it is), small and empty ones."""
    g = torch.Generator().manual_seed(31)
    big = torch.randn(300_001, generator=g)
    mat = torch.randint(-1000, 1000, (129, 67), dtype=torch.int32, generator=g)
    return {"big": big, "head": big[1000:5000], "mat_t": mat.t(),
            "bf16": torch.randn(4097, generator=g).to(torch.bfloat16),
            "u8": torch.randint(0, 256, (3,), dtype=torch.uint8, generator=g),
            "scalar": torch.tensor(2.5, dtype=torch.float64), "empty": torch.empty(0, 5),
            "step": 7}


def _dcp(fn, *args, **kw):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # no process group: DCP warns
        return fn(*args, no_dist=True, **kw)


def dcp_images(d):
    """{item: {record: (bytes, CRC-32)}} of a DCP directory's torch.save
    images (the random serialization id left out; a CRC-32 is 0 or
    right), and the location tags they record."""
    import io
    import zipfile
    import zlib
    from torch.distributed.checkpoint import FileSystemReader
    md = FileSystemReader(str(d)).read_metadata()
    out, locs = {}, set()
    for idx, info in md.storage_data.items():
        with open(os.path.join(d, info.relative_path), "rb") as f:
            f.seek(info.offset)
            blob = f.read(info.length)
        recs = {}
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            for info in z.infolist():
                if info.filename.endswith("serialization_id"):
                    continue
                crc = info.CRC
                del info.CRC                # 0 where not computed: read unchecked
                data = z.open(info).read()
                assert crc in (0, zlib.crc32(data)), (idx.fqn, info.filename)
                recs[info.filename.split("/", 1)[1]] = (data, crc)
        out[idx.fqn] = recs

        def keep(s, loc):
            locs.add(loc)
            return s
        torch.load(io.BytesIO(blob), map_location=keep, weights_only=True)
    return out, locs


def dcp_dests(sd):
    return {k: torch.zeros_like(v, memory_format=torch.contiguous_format)
            for k, v in sd.items() if isinstance(v, torch.Tensor)} | {"step": 0}


@pytest.mark.parametrize("crc32", [False, True], ids=["nocrc", "crc"])
@pytest.mark.parametrize("cls", HANDLES)
def test_dcp_save_from_cuda(gpu, cls, engine, crc32, tmp_path):
    """nvio.dcp's FileSystemWriter writes device tensors from device memory:
    every image holds the bytes of the same save from the CPU (data
    records, pickles; "cpu" locations, as DCP's writer records), the zip
    CRC-32s right when asked for; DCP's reader and nvio's load it."""
    import torch.distributed.checkpoint as dcp
    from nvio import dcp as nd
    sd = dcp_state()
    dsd = on_device(gpu, sd)
    n = sum(1 for v in dsd.values() if isinstance(v, torch.Tensor) and v.nbytes)
    with cls(engine=engine) as h:
        _dcp(dcp.save, sd, storage_writer=nd.FileSystemWriter(tmp_path / "ref", handle=h,
                                                               crc32=crc32))
        before = gpu.counters()
        _dcp(dcp.save, dsd, storage_writer=nd.FileSystemWriter(tmp_path / "dev", handle=h,
                                                               crc32=crc32))
        if before is not None:
            nv, d2h, io = (b - a for a, b in zip(before, gpu.counters()))
            if cls is nvio.GdsHandle:
                assert io >= n, (nv, d2h, io)       # one cuFile write per storage
            else:
                assert nv >= n and io == 0, (nv, d2h, io)
            # the application copies device bytes to the host only for CRC-32s
            assert d2h == (n if crc32 else 0), (nv, d2h, io)
        got, locs = dcp_images(tmp_path / "dev")
        want, _ = dcp_images(tmp_path / "ref")
        assert got == want and locs == {"cpu"}
        for reader in (dcp.FileSystemReader(tmp_path / "dev"),
                       nd.FileSystemReader(tmp_path / "dev", handle=h)):
            dst = dcp_dests(sd)
            _dcp(dcp.load, dst, storage_reader=reader)
            for k, v in sd.items():
                if isinstance(v, torch.Tensor):
                    assert torch.equal(dst[k], v), k
            assert dst["step"] == 7
    # the CRC-32s were computed (and are right: dcp_images) where asked for
    data = [(d, c) for recs in got.values() for r, (d, c) in recs.items()
            if r.startswith("data/") and d]
    assert len(data) == 6 and all((c != 0) == crc32 for d, c in data), data
    gpu.check_clean()


@pytest.mark.parametrize("cls", HANDLES)
def test_dcp_load_into_cuda(gpu, cls, engine, tmp_path):
    """nvio.dcp's FileSystemReader fills device destinations: contiguous
    ones of the saved dtype straight from the file (libnvio's bounce copies
    or cuFile), the others (a transposed chunk, another dtype) through a
    host buffer and one host-to-device copy each. Files of nvio's writer
    and of DCP's own."""
    import torch.distributed.checkpoint as dcp
    from nvio import dcp as nd
    sd = dcp_state()
    _dcp(dcp.save, sd, storage_writer=nd.FileSystemWriter(tmp_path / "nv"))
    _dcp(dcp.save, sd, storage_writer=dcp.FileSystemWriter(tmp_path / "dc"))
    for d in ("nv", "dc"):
        dst = dcp_dests(sd)
        dst["bf16"] = torch.zeros(4097)                 # float32: DCP converts
        ddst = on_device(gpu, dst)
        with cls(engine=engine) as h:
            before = gpu.counters()
            h2d = getattr(getattr(gpu, "provider", None), "h2d_sync", 0)
            _dcp(dcp.load, ddst, storage_reader=nd.FileSystemReader(tmp_path / d, handle=h))
            if before is not None:
                nv, d2h, io = (b - a for a, b in zip(before, gpu.counters()))
                assert nv + io >= 4 and d2h == 0, (nv, d2h, io)   # big, head, u8, scalar
                assert gpu.provider.h2d_sync - h2d == 2         # mat_t, bf16: bounced
        assert ddst["step"] == 7
        for k, v in sd.items():
            if isinstance(v, torch.Tensor) and v.numel():
                want = v.float() if k == "bf16" else v
                if REAL:
                    assert torch.equal(ddst[k].cpu(), want), (d, k)
                else:
                    same(gpu, ddst[k], want, (d, k))
    gpu.check_clean()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("cls", HANDLES)
def test_dcp_async_save_from_cuda(gpu, cls, engine, tmp_path):
    """dcp.async_save with nvio's writer as its stager: device tensors are
    copied into the locked snapshot by device-to-host copies (one per
    storage), before async_save returns; the files equal a CPU save's."""
    import torch.distributed.checkpoint as dcp
    from nvio import dcp as nd
    sd = dcp_state()
    dsd = on_device(gpu, sd)
    n = len(device_storages(dsd))
    with cls(engine=engine) as h:
        _dcp(dcp.save, sd, storage_writer=nd.FileSystemWriter(tmp_path / "ref", handle=h))
        w = nd.FileSystemWriter(tmp_path / "dev", handle=h)
        before = gpu.counters()
        fut = _dcp(dcp.async_save, dsd, storage_writer=w)
        if before is not None:
            assert gpu.counters()[1] - before[1] >= n    # the snapshot, taken already
        (getattr(fut, "upload_completion", None) or fut).result()
        w.close()
    got, locs = dcp_images(tmp_path / "dev")
    want, _ = dcp_images(tmp_path / "ref")
    assert got == want and locs == {"cpu"}
    gpu.check_clean()
