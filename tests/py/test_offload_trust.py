"""nvio.offload does not trust the stores it wrote itself (issue 35, items
6 and 8): tampered Swapper indexes and weight-store manifests are refused
field by field, flipped bytes are caught by CRC-32s, stores written before
the CRCs still open, non-regular files at the stores' paths are refused
without hanging, NVMeOptimizer refuses nonsense arguments, and Ctrl-C
lands promptly on every engine."""
import copy
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from nvio_testutil import same

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from nvio.offload import (NVMeOptimizer, WeightReadError, SwapCorruptError,  # noqa: E402
                          SwapError, Swapper, run_from_disk, run_from_memory)
from nvio.offload._weights import StoreCorruptError  # noqa: E402

import nvio  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# Children import the nvio this test imported (installed by pip in CI, the
# source tree's python/ after an in-place build), never python/ by path.
PY = os.path.dirname(os.path.dirname(os.path.abspath(nvio.__file__)))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --- Swapper checkpoints -----------------------------------------------------


def _checkpoint(tmp_path, engine, direct=False):
    """A checkpoint of a few keys of several dtypes; (path, {key: tensor})."""
    g = torch.Generator().manual_seed(7)
    want = {("w", 0): torch.randn(3000, generator=g),
            "b": torch.randint(0, 100, (5, 7), generator=g).to(torch.int16),
            1: torch.randn(2, 2, generator=g).to(torch.bfloat16),
            ("t", ("n", 2)): torch.empty(0, 4)}
    sw_dir = tmp_path / "swap"
    sw_dir.mkdir(exist_ok=True)
    with Swapper([str(sw_dir)], 256 << 10, engine=engine, direct=direct) as sw:
        for k, t in want.items():
            sw.swap_out(k, t)
        ck = tmp_path / "ck"
        sw.checkpoint(str(ck))
    return ck, want


def _restore(ck, tmp_path, engine, direct=False):
    return Swapper.restore(str(ck), [str(tmp_path / "swap")], 256 << 10, engine=engine,
                           direct=direct)


def test_checkpoint_keeps_a_crc_per_key_and_restores(tmp_path, engine, direct):
    ck, want = _checkpoint(tmp_path, engine, direct)
    idx = json.loads((ck / "index.json").read_text())
    assert idx["format"] == 2
    data = (ck / "data.bin").read_bytes()
    import zlib
    for it in idx["keys"]:
        assert it["crc32"] == zlib.crc32(data[it["offset"]:it["offset"] + it["nbytes"]])
    with _restore(ck, tmp_path, engine, direct) as sw:
        for k, t in want.items():
            assert same(sw.swap_in(k, out=torch.empty_like(t)), t), k


def test_every_dtype_a_swapper_takes_restores(tmp_path, engine):
    """restore's dtype table covers whatever checkpoint() writes: bit
    containers and quantized integers were written, then refused as a
    corrupt index (the checkpoint could never be restored)."""
    dtypes = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
    taken = []
    for dt in dtypes:
        try:
            raw = torch.arange(64, dtype=torch.uint8)
            raw = raw % 2 if dt is torch.bool else raw
            t = raw.view(dt).reshape(4, -1)
        except (RuntimeError, TypeError):
            continue
        sw_dir = tmp_path / ("swap_" + str(dt)[6:])
        sw_dir.mkdir()
        ck = tmp_path / ("ck_" + str(dt)[6:])
        with Swapper([str(sw_dir)], 1 << 20, engine=engine) as sw:
            try:
                sw.swap_out("a", t)
            except (SwapError, TypeError, ValueError, RuntimeError):
                continue                # refused on the way in: nothing to restore
            sw.checkpoint(str(ck))
        taken.append(dt)
        with Swapper.restore(str(ck), [str(sw_dir)], 1 << 20, engine=engine) as sw:
            back = sw.swap_in("a")
        assert back.dtype == dt and tuple(back.shape) == tuple(t.shape), (dt, back.dtype)
        assert same(back.view(torch.uint8), t.view(torch.uint8)), dt
    assert torch.float32 in taken and torch.quint8 in taken and torch.bits8 in taken, taken


def test_flipped_byte_in_swapper_data_is_caught(tmp_path, engine, direct):
    ck, want = _checkpoint(tmp_path, engine, direct)
    idx = json.loads((ck / "index.json").read_text())
    big = max(idx["keys"], key=lambda it: it["nbytes"])
    where = big["offset"] + big["nbytes"] // 2 + 3
    with open(ck / "data.bin", "r+b") as f:
        f.seek(where)
        b = f.read(1)
        f.seek(where)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(SwapCorruptError) as ei:
        _restore(ck, tmp_path, engine, direct)
    e = ei.value
    assert e.errno == errno.EBADMSG and e.key == ("w", 0) and e.offset == big["offset"]
    assert str(ck / "data.bin") in str(e) and "CRC-32" in str(e)
    # the swap files of the failed restore are gone
    assert os.listdir(tmp_path / "swap") == []


def test_format_1_checkpoints_without_crcs_still_restore(tmp_path, engine):
    ck, want = _checkpoint(tmp_path, engine)
    idx = json.loads((ck / "index.json").read_text())
    idx["format"] = 1
    del idx["crc32"]
    for it in idx["keys"]:
        del it["crc32"]
    (ck / "index.json").write_text(json.dumps(idx))
    with _restore(ck, tmp_path, engine) as sw:
        for k, t in want.items():
            assert same(sw.swap_in(k, out=torch.empty_like(t)), t), k
    idx["keys"][0]["crc32"] = 5          # format 1 has no such field
    (ck / "index.json").write_text(json.dumps(idx))
    with pytest.raises(SwapCorruptError, match=r"keys\[0\]\.crc32"):
        _restore(ck, tmp_path, engine)


def test_format_2_index_without_its_own_crc_still_restores(tmp_path, engine):
    """The first format 2 files had CRC-32s per key only: they restore."""
    ck, want = _checkpoint(tmp_path, engine)
    idx = json.loads((ck / "index.json").read_text())
    assert isinstance(idx.pop("crc32"), int)
    (ck / "index.json").write_text(json.dumps(idx))
    with _restore(ck, tmp_path, engine) as sw:
        for k, t in want.items():
            assert same(sw.swap_in(k, out=torch.empty_like(t)), t), k


def _set(path, value):
    def f(idx):
        obj = idx
        for p in path[:-1]:
            obj = obj[p]
        obj[path[-1]] = value
    return f


def _delete(path):
    def f(idx):
        obj = idx
        for p in path[:-1]:
            obj = obj[p]
        del obj[path[-1]]
    return f


def _overlap(idx):
    k = idx["keys"]
    k[1]["offset"] = k[0]["offset"]


def _duplicate(idx):
    idx["keys"].append(copy.deepcopy(idx["keys"][0]))


# (mutation of index.json, the field the error must name)
INDEX_CASES = [
    (_set(("keys", 0, "dtype"), "load"), "keys[0].dtype"),
    (_set(("keys", 0, "dtype"), "__class__"), "keys[0].dtype"),
    (_set(("keys", 0, "dtype"), "Tensor"), "keys[0].dtype"),
    (_set(("keys", 0, "dtype"), 7), "keys[0].dtype"),
    (_delete(("keys", 0, "dtype")), "keys[0].dtype"),
    (_delete(("keys", 1, "key")), "keys[1].key"),
    (_set(("keys", 0, "key"), {"x": 1}), "keys[0].key"),
    (_set(("keys", 0, "key"), {"i": True}), "keys[0].key.i"),
    (_set(("keys", 0, "key"), {"s": 5}), "keys[0].key.s"),
    (_set(("keys", 0, "key"), {"t": {"s": "a"}}), "keys[0].key.t"),
    (_set(("keys", 0, "key"), {"s": "a", "i": 1}), "keys[0].key"),
    (_set(("keys", 0, "key"), json.loads('{"t": [' * 40 + ']}' * 40)),
     "keys[0].key" + ".t[0]" * 33),                                   # nested too deep
    (_set(("keys", 0, "shape"), [-1]), "keys[0].shape[0]"),
    (_set(("keys", 0, "shape"), ["3000"]), "keys[0].shape[0]"),
    (_set(("keys", 0, "shape"), 3000), "keys[0].shape"),
    (_set(("keys", 0, "shape"), [1] * 65), "keys[0].shape"),
    (_set(("keys", 0, "shape"), [6000]), "keys[0].nbytes"),        # shape and size disagree
    (_set(("keys", 0, "nbytes"), 4), "keys[0].nbytes"),
    (_set(("keys", 0, "nbytes"), -12000), "keys[0].nbytes"),
    (_set(("keys", 0, "offset"), -4096), "keys[0].offset"),
    (_set(("keys", 0, "offset"), 100), "keys[0].offset"),
    (_set(("keys", 0, "offset"), 1.5), "keys[0].offset"),
    (_set(("keys", 0, "offset"), 1 << 40), "keys[0].offset"),        # past the data file
    (_overlap, ("keys[0].offset", "keys[1].offset")),             # either of the two
    (_duplicate, "keys[4].key"),
    (_set(("keys", 0, "crc32"), -1), "keys[0].crc32"),
    (_set(("keys", 0, "crc32"), 1 << 32), "keys[0].crc32"),
    (_set(("keys", 0, "crc32"), "0"), "keys[0].crc32"),
    (_set(("keys", 0, "evil"), 1), "keys[0].evil"),
    (_set(("keys", 0), ["key"]), "keys[0]"),
    (_set(("keys",), {"a": 1}), "keys"),
    (_set(("format",), 3), "format"),
    (_set(("format",), "2"), "format"),
    (_set(("extra",), None), "extra"),
    (_delete(("keys",)), "keys"),
    # plausible on their own: only the index's CRC-32 tells
    (_set(("keys", 0, "dtype"), "int32"), "crc32"),
    (_set(("keys", 0, "shape"), [1000, 3]), "crc32"),
    (_set(("keys", 0, "key"), {"s": "x"}), "crc32"),
    (_set(("crc32",), 1 << 32), "crc32"),
]


@pytest.mark.parametrize("case", range(len(INDEX_CASES)))
def test_tampered_swapper_index_is_refused_naming_the_field(tmp_path, engine, case):
    mutate, fields = INDEX_CASES[case]
    ck, _ = _checkpoint(tmp_path, engine)
    idx = json.loads((ck / "index.json").read_text())
    mutate(idx)
    (ck / "index.json").write_text(json.dumps(idx))
    with pytest.raises(SwapCorruptError) as ei:
        _restore(ck, tmp_path, engine)
    fields = fields if isinstance(fields, tuple) else (fields,)
    assert ei.value.field in fields, (str(ei.value), fields)
    assert ei.value.field in str(ei.value)
    assert str(ck) in str(ei.value)
    assert os.listdir(tmp_path / "swap") == []      # refused before any swapper was made


@pytest.mark.parametrize("text", ["[]", '"x"', "null", "[" * 100000, "{\"format\": 2",
                                  "{\"format\": NaN, \"keys\": []}"],
                         ids=["list", "str", "null", "deep", "cut", "nan"])
def test_index_that_is_no_object_is_a_swap_error(tmp_path, engine, text):
    ck, _ = _checkpoint(tmp_path, engine)
    (ck / "index.json").write_text(text)
    with pytest.raises(SwapError) as ei:
        _restore(ck, tmp_path, engine)
    assert str(ck / "index.json") in str(ei.value)


# --- non-regular files, in a child under a timeout ---------------------------


def _child(code, timeout=120):
    """Run code in a fresh interpreter; a hang fails the test after timeout."""
    env = dict(os.environ, PYTHONPATH=PY + os.pathsep + HERE)
    try:
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                           text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("hung: no answer within %d s" % timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.parametrize("which", ["index.json", "data.bin", ".index.json.tmp"])
def test_fifo_in_a_swapper_checkpoint_is_refused_not_waited_for(tmp_path, engine, which):
    ck, _ = _checkpoint(tmp_path, engine)
    p = ck / which
    if p.exists():
        p.unlink()
    os.mkfifo(p)
    out = _child("""
        import os, torch
        from nvio.offload import Swapper, SwapError
        try:
            if %(which)r == ".index.json.tmp":
                with Swapper([%(swap)r], 1 << 20, engine=%(engine)r) as sw:
                    sw.swap_out("a", torch.ones(10))
                    sw.checkpoint(%(ck)r)
            else:
                Swapper.restore(%(ck)r, [%(swap)r], 1 << 20, engine=%(engine)r)
            print("no error")
        except SwapError as e:
            print("SwapError", e)
    """ % dict(which=which, ck=str(ck), swap=str(tmp_path / "swap"), engine=engine))
    assert out.startswith("SwapError"), out
    assert str(p) in out and "FIFO" in out, out


def _stack(seed=0, d=48, n=5):
    torch.manual_seed(seed)
    layers = [nn.Linear(16, d)]
    for _ in range(n):
        layers.append(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.ReLU()))
    layers.append(nn.Linear(d, 8))
    return nn.Sequential(*layers).eval()


STORE_CHILD = """
    import os, sys, torch
    from torch import nn
    sys.path.insert(0, %(here)r)
    from test_offload_trust import _stack
    from nvio.offload import run_from_disk
    m = _stack()
    try:
        run_from_disk(m, %(dir)r, engine=%(engine)r, source=%(source)r)
        print("no error")
    except (OSError, ValueError) as e:
        print(type(e).__name__, e)
"""


@pytest.mark.parametrize("which", ["nvio-weights.json", "nvio-weights.bin",
                                   "model.safetensors"])
def test_fifo_at_a_weights_path_is_refused_not_waited_for(tmp_path, engine, which):
    m = _stack()
    source = "store"
    if which == "model.safetensors":
        source = "auto"
    else:
        run_from_disk(m, str(tmp_path), engine=engine)
        run_from_memory(m)
    p = tmp_path / which
    if p.exists():
        p.unlink()
    os.mkfifo(p)
    out = _child(STORE_CHILD % dict(here=HERE, dir=str(tmp_path), engine=engine,
                                    source=source))
    assert str(p) in out and "FIFO" in out, out


# --- nvio's weight store ----------------------------------------------------


def _store(tmp_path, engine, seed=0):
    m = _stack(seed)
    x = torch.randn(4, 16)
    with torch.no_grad():
        ref = m(x)
    run_from_disk(m, str(tmp_path), engine=engine)
    assert m._nvio_from_disk.stats()["crc"] is True
    run_from_memory(m)
    return m, x, ref


def _unsampled_byte(man, block):
    """A byte of block's largest tensor that the sample hash does not read
    (it reads 64 bytes at the head, middle and tail of each)."""
    b = man["blocks"][block]

    def size(t):
        n = getattr(torch, t[1]).itemsize
        for s in t[2]:
            n *= s
        return n
    t = max(b["tensors"], key=size)
    assert size(t) > 4 * 64 + 200
    return b["offset"] + t[3] + 64 + 100 + 3        # a float32's sign/exponent byte


def _flip(path, at, mask=0x01):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ mask]))


def test_flipped_byte_in_the_weight_store_is_caught(tmp_path, engine, direct):
    m, x, ref = _store(tmp_path, engine)
    man = json.loads((tmp_path / "nvio-weights.json").read_text())
    assert all(isinstance(b["crc32"], int) for b in man["blocks"])
    _flip(tmp_path / "nvio-weights.bin", _unsampled_byte(man, 2), 0x20)
    run_from_disk(m, str(tmp_path), engine=engine, direct=direct)     # samples still match
    try:
        with pytest.raises(WeightReadError) as ei, torch.no_grad():
            m(x)
        assert ei.value.errno == errno.EBADMSG
        msg = str(ei.value)
        assert "CRC-32" in msg and "nvio-weights.bin" in msg and "'3'" in msg, msg
    finally:
        try:
            run_from_memory(m)
        except WeightReadError:
            pass
    # verify=False reads it unchecked (and the outputs differ: what the CRC caught)
    m2 = _stack()
    run_from_disk(m2, str(tmp_path), engine=engine, verify=False)
    assert m2._nvio_from_disk.stats()["crc"] is False
    with torch.no_grad():
        assert not torch.equal(m2(x), ref)
    run_from_memory(m2)


def test_flipped_byte_in_a_resident_tensor_is_caught(tmp_path, engine):
    m, x, ref = _store(tmp_path, engine)
    man = json.loads((tmp_path / "nvio-weights.json").read_text())
    res = man["blocks"][-1]
    assert res["name"] == "<resident>"
    name, dt, shape, off, crc = res["tensors"][0]
    _flip(tmp_path / "nvio-weights.bin", res["offset"] + off + 64 * 2 + 5)
    with torch.device("meta"):
        empty = _stack()
    with pytest.raises(WeightReadError, match="%s.* CRC-32 " % name.replace(".", r"\.")):
        run_from_disk(empty, str(tmp_path), engine=engine)


def test_store_without_crcs_still_streams(tmp_path, engine):
    m, x, ref = _store(tmp_path, engine)
    p = tmp_path / "nvio-weights.json"
    man = json.loads(p.read_text())
    for b in man["blocks"]:
        del b["crc32"]
        b["tensors"] = [t[:4] for t in b["tensors"]]
    p.write_text(json.dumps(man))
    st = os.stat(tmp_path / "nvio-weights.bin")
    run_from_disk(m, str(tmp_path), engine=engine)
    assert m._nvio_from_disk.stats()["crc"] is False
    with torch.no_grad():
        assert torch.equal(m(x), ref)
    run_from_memory(m)
    assert os.stat(tmp_path / "nvio-weights.bin").st_ino == st.st_ino     # not rewritten
    # rebuild=True writes it again, with CRCs
    run_from_disk(m, str(tmp_path), engine=engine, rebuild=True)
    assert m._nvio_from_disk.stats()["crc"] is True
    run_from_memory(m)


def _mset(path, value):
    return _set(path, value)


MANIFEST_CASES = [
    (_mset(("version",), 2), "version"),
    (_mset(("version",), True), "version"),
    (_mset(("fingerprint",), "x" * 64), "fingerprint"),
    (_mset(("sample",), 5), "sample"),
    (_mset(("data",), "../../etc/hostname"), "data"),
    (_mset(("data_size",), -4096), "data_size"),
    (_mset(("data_size",), 1 << 40), "data_size"),
    (_mset(("blocks", 0, "offset"), 100), "blocks[0].offset"),
    (_mset(("blocks", 1, "offset"), 0), "blocks[1].offset"),
    (_mset(("blocks", 1, "nbytes"), 1 << 40), "blocks[1].nbytes"),
    (_mset(("blocks", 1, "crc32"), -5), "blocks[1].crc32"),
    (_mset(("blocks", 1, "name"), None), "blocks[1].name"),
    (_mset(("blocks", 1, "extra"), 0), "blocks[1].extra"),
    (_mset(("blocks", 1, "tensors", 0, 1), "load"), "blocks[1].tensors[0][1]"),
    (_mset(("blocks", 1, "tensors", 0, 1), "__class__"), "blocks[1].tensors[0][1]"),
    (_mset(("blocks", 1, "tensors", 0, 2), [-3]), "blocks[1].tensors[0][2][0]"),
    (_mset(("blocks", 1, "tensors", 0, 2), [1 << 30]), "blocks[1].tensors[0][2]"),
    (_mset(("blocks", 1, "tensors", 0, 3), 1), "blocks[1].tensors[0][3]"),
    (_mset(("blocks", 1, "tensors", 0, 4), "crc"), "blocks[1].tensors[0][4]"),
    (_mset(("blocks", 1, "tensors", 0), ["a"]), "blocks[1].tensors[0]"),
    (_mset(("blocks",), {}), "blocks"),
    (_mset(("hidden",), 1), "hidden"),
    # well-formed, but not where the model's layout puts it
    (_mset(("blocks", 1, "tensors", 0, 0), "0.0.weight"), "blocks[1].tensors[0]"),
    (_mset(("blocks", 1, "name"), "0"), "blocks[1].name"),
]


@pytest.mark.parametrize("case", range(len(MANIFEST_CASES)))
def test_tampered_store_manifest_is_refused_naming_the_field(tmp_path, engine, case):
    mutate, field = MANIFEST_CASES[case]
    m, x, ref = _store(tmp_path, engine)
    p = tmp_path / "nvio-weights.json"
    man = json.loads(p.read_text())
    mutate(man)
    p.write_text(json.dumps(man))
    with pytest.raises(StoreCorruptError) as ei:
        run_from_disk(m, str(tmp_path), engine=engine)
    assert ei.value.field == field, (str(ei.value), field)
    assert field in str(ei.value) and str(p) in str(ei.value)
    assert not hasattr(m, "_nvio_from_disk")
    # rebuild=True replaces it (the weights are in memory)
    run_from_disk(m, str(tmp_path), engine=engine, rebuild=True)
    with torch.no_grad():
        assert torch.equal(m(x), ref)
    run_from_memory(m)


# --- NVMeOptimizer's arguments ----------------------------------------------


@pytest.mark.parametrize("kw,name", [
    (dict(sub_group_numel=0), "sub_group_numel"),
    (dict(sub_group_numel=-5), "sub_group_numel"),
    (dict(sub_group_numel=1.5), "sub_group_numel"),
    (dict(sub_group_numel=True), "sub_group_numel"),
    (dict(sub_group_numel="8"), "sub_group_numel"),
    (dict(pool_bytes=-1), "pool_bytes"),
    (dict(pool_bytes=1.5), "pool_bytes"),
    (dict(master_weights="yes"), "master_weights"),
    (dict(master_weights=None), "master_weights"),
    (dict(swapper="not a swapper"), "swapper"),
    (dict(model_offload=object()), "model_offload"),
])
def test_nvme_optimizer_refuses_bad_arguments(tmp_path, kw, name):
    p = nn.Parameter(torch.randn(100))
    opt = torch.optim.AdamW([p])
    with pytest.raises((ValueError, TypeError), match=name):
        NVMeOptimizer(opt, str(tmp_path), **kw)
    assert os.listdir(tmp_path) == []


def test_nvme_optimizer_sub_group_numel_one_steps_like_torch(tmp_path, engine):
    torch.manual_seed(3)
    ps = [nn.Parameter(torch.randn(n)) for n in (3, 1, 5)]
    ref = [nn.Parameter(p.detach().clone()) for p in ps]
    opt = NVMeOptimizer(torch.optim.AdamW(ps), str(tmp_path), sub_group_numel=1,
                        engine=engine)
    ropt = torch.optim.AdamW(ref)
    for _ in range(2):
        for a, b in zip(ps, ref):
            a.grad = torch.ones_like(a)
            b.grad = torch.ones_like(b)
        opt.step()
        ropt.step()
    for a, b in zip(ps, ref):
        assert torch.equal(a, b)
    opt.close()


# --- Ctrl-C during a blocking call, on a slow device --------------------------

SLOW_SHIM = os.path.join(HERE, "faultlib", "slow_preload.c")
SIGINT_CHILD = r"""
import os, sys, time, torch, nvio
path, engine, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = nvio.AioHandle(engine=engine, direct=False, intra_op_parallelism=2)
f = h.open(path)
buf = torch.empty(size, dtype=torch.uint8)
for call in ("sync_pread", "file_pread", "read"):
    print("ready", call, flush=True)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 60:
            if call == "sync_pread":
                h.sync_pread(buf, path)
            elif call == "file_pread":
                f.pread(buf, 0)
            else:
                h.read(buf, path)
        print("not interrupted", flush=True)
        sys.exit(1)
    except KeyboardInterrupt:
        t = time.monotonic()
    sys.stdin.readline()               # the parent's clock of the signal
    print("interrupted", call, "%.3f" % (t - float(sys.stdin.readline())), flush=True)
f.close()
h.close()
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def slow_reads(tmp_path_factory):
    """The shim that makes each pread/preadv of a thread run at a disk's pace."""
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build the slow-read shim")
    out = tmp_path_factory.mktemp("slow") / "slow_preload.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), SLOW_SHIM, "-ldl"],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.fail("building the slow-read shim failed:\n" + r.stderr)
    return str(out)


def test_ctrl_c_lands_within_a_second_on_a_slow_device(slow_reads, engine):
    """Each worker reads at 50 MB/s (one request at a time, as psync's
    workers do on a disk that takes one at a time): Ctrl-C must land once
    what the call has in flight ends, under 1 s. psync had 4 x 64 MiB in
    flight: 2.7 s. (io_uring and libaio read without pread: unslowed.)"""
    size = 384 << 20
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.statvfs(shm).f_bavail * os.statvfs(shm).f_frsize < 2 * size:
        pytest.skip("needs %d MiB free on %s" % (2 * size >> 20, shm))
    path = os.path.join(shm, "nvio_slow_sigint_%d_%s" % (os.getpid(), os.urandom(4).hex()))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)                 # sparse: the shim's sleeps are the time
    os.close(fd)
    env = dict(os.environ, LD_PRELOAD=slow_reads, NVIO_TEST_READ_BPS=str(50 * 10**6),
               PYTHONPATH=PY)
    p = subprocess.Popen([sys.executable, "-c", SIGINT_CHILD, path, engine, str(size)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    try:
        took = {}
        for call in ("sync_pread", "file_pread", "read"):
            line = p.stdout.readline().split()
            assert line == ["ready", call], (line, p.stderr.read() if p.poll() else "")
            time.sleep(0.3)                # inside the call: 30 MB read of 384
            sent = time.monotonic()
            p.send_signal(signal.SIGINT)
            p.stdin.write("\n%r\n" % sent)
            p.stdin.flush()
            line = p.stdout.readline().split()
            assert line[:2] == ["interrupted", call], (line, p.stderr.read())
            took[call] = float(line[2])
        assert p.stdout.readline().strip() == "done"
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.unlink(path)
    assert all(t < 1.0 for t in took.values()), (engine, took)


def test_fifo_among_the_weights_is_not_waited_for_by_the_page_cache_count(tmp_path):
    """_room.cached_bytes (how much of the weights the page cache holds)
    opened every path to mincore it: a FIFO blocked it forever."""
    os.mkfifo(tmp_path / "w.bin")
    reg = tmp_path / "r.bin"
    reg.write_bytes(b"x" * 8192)
    out = _child("""
        from nvio.offload import _room
        print(_room.cached_bytes([(%r, 0, 4096), (%r, 0, 8192)]))
    """ % (str(tmp_path / "w.bin"), str(reg)))
    assert 0 <= int(out) <= 8192       # the FIFO counts nothing


def test_fifo_config_of_the_generate_command_is_refused(tmp_path):
    os.mkfifo(tmp_path / "config.json")
    env = dict(os.environ, PYTHONPATH=PY)
    try:
        r = subprocess.run([sys.executable, "-m", "nvio.offload.generate", "--config",
                            str(tmp_path), "--dir", str(tmp_path / "s")], capture_output=True,
                           text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("hung on the FIFO")
    assert r.returncode != 0 and "FIFO" in r.stderr and str(tmp_path) in r.stderr, r.stderr
