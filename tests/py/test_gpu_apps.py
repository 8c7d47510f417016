"""nvio's applications on CUDA destinations: nvio.load(map_location="cuda")
and nvio.safetensors.load_file(device="cuda"), on every engine, through
AioHandle (bounce buffers) and GdsHandle (cuFile).

With a usable CUDA device in torch the results are CUDA tensors. Without
one (CI, torch's CPU build) the simulated driver (tests/sim/, loaded by
gpusim) stands in: gpusim.TorchProvider, installed as nvio._device's
provider, gives the applications CPU torch storages over simulated device
memory (a host access faults), which libnvio finds to be device memory
through the simulated driver and fills through its GPU paths. The bytes
are then read back through the simulator's back door and compared, storage
by storage, with what torch.load reads to the CPU.
"""
import gc

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
