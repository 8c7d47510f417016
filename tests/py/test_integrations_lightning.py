"""nvio.integrations.lightning: Lightning's checkpoints saved by nvio.save,
read by nvio.load, under AsyncCheckpointIO too; resumed training equals an
uninterrupted run; ModelCheckpoint's top-k removal."""
import os
import zipfile

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO  # noqa: E402

import nvio  # noqa: E402
from nvio.integrations.lightning import NvioCheckpointIO  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: on a machine whose cores are all busy, torch's
    spinning threads make each step tens of times slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True, on_step=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 8, generator=g)
    ds = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).sin())
    return torch.utils.data.DataLoader(ds, batch_size=16, shuffle=False)


def _trainer(root, plugin, epochs, callbacks=()):
    return L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, plugins=[plugin],
                     default_root_dir=str(root), logger=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=list(callbacks),
                     enable_checkpointing=bool(callbacks), num_sanity_val_steps=0)


def _fit(root, plugin, epochs, ckpt_path=None, callbacks=()):
    L.seed_everything(0, verbose=False)
    model = Tiny()
    trainer = _trainer(root, plugin, epochs, callbacks)
    trainer.fit(model, _data(), ckpt_path=ckpt_path)
    return model, trainer


def _state(model, trainer):
    opt = trainer.optimizers[0].state_dict()
    return model.state_dict(), opt


def _assert_same(a, b):
    (wa, oa), (wb, ob) = a, b
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert oa["param_groups"] == ob["param_groups"]
    assert oa["state"].keys() == ob["state"].keys()
    for i in oa["state"]:
        for k in oa["state"][i]:
            assert torch.equal(oa["state"][i][k], ob["state"][i][k]), (i, k)


def _written_by_nvio(path):
    """nvio.save marks its files with a .data/nvio_format record."""
    with zipfile.ZipFile(path) as z:
        return any(n.endswith("/.data/nvio_format") for n in z.namelist())


def _plugin(kind, engine):
    """sync: NvioCheckpointIO; async: under Lightning's AsyncCheckpointIO;
    nvio-async: NvioCheckpointIO(asynchronous=True)."""
    h = nvio.AioHandle(engine=engine)
    if kind == "nvio-async":
        return NvioCheckpointIO(handle=h, asynchronous=True)
    base = NvioCheckpointIO(handle=h)
    return base if kind == "sync" else AsyncCheckpointIO(base)


@pytest.mark.parametrize("kind", ["sync", "async", "nvio-async"])
def test_resume_equals_uninterrupted_run(tmp_path, engine, kind):
    whole = _state(*_fit(tmp_path / "whole", _plugin(kind, engine), 4))
    cb = ModelCheckpoint(dirpath=str(tmp_path / "ck"), save_last=True, save_top_k=0)
    _fit(tmp_path / "first", _plugin(kind, engine), 2, callbacks=[cb])
    last = tmp_path / "ck" / "last.ckpt"
    assert _written_by_nvio(last)
    ck = torch.load(str(last), weights_only=True)          # torch reads it as is
    assert ck["global_step"] == 8
    model, trainer = _fit(tmp_path / "second", _plugin(kind, engine), 4, ckpt_path=str(last))
    assert trainer.global_step == 16
    _assert_same(_state(model, trainer), whole)


def test_torch_checkpoint_io_reads_nvio_and_back(tmp_path):
    """A checkpoint of either plugin resumes under the other: same training."""
    whole = _state(*_fit(tmp_path / "whole", TorchCheckpointIO(), 3))
    for first, second in ((NvioCheckpointIO(), TorchCheckpointIO()),
                          (TorchCheckpointIO(), NvioCheckpointIO())):
        d = tmp_path / type(first).__name__
        _fit(d, first, 1, callbacks=[ModelCheckpoint(dirpath=str(d), save_last=True, save_top_k=0)])
        got = _state(*_fit(d / "r", second, 3, ckpt_path=str(d / "last.ckpt")))
        _assert_same(got, whole)


# Not under Lightning's AsyncCheckpointIO: it removes a file without waiting
# for the save of it that its thread may not have started (see the module).
@pytest.mark.parametrize("kind", ["sync", "nvio-async"])
def test_top_k_removal(tmp_path, kind):
    d = tmp_path / "ck"
    cb = ModelCheckpoint(dirpath=str(d), monitor="train_loss", save_top_k=2,
                         filename="e{epoch}", every_n_epochs=1)
    _fit(tmp_path, _plugin(kind, "psync"), 5, callbacks=[cb])
    kept = sorted(os.listdir(d))
    assert len(kept) == 2, kept
    assert sorted(os.path.basename(p) for p in cb.best_k_models) == kept
    for name in kept:
        assert _written_by_nvio(d / name)
        assert nvio.load(str(d / name), weights_only=True)["state_dict"].keys()


def test_async_remove_and_load_wait_for_the_save(tmp_path, engine):
    """asynchronous=True: a removal right after the save removes the file the
    save writes (never lets it land afterwards); a load right after the save
    reads it whole; teardown leaves nothing queued."""
    io = NvioCheckpointIO(handle=nvio.AioHandle(engine=engine), asynchronous=True,
                          durable=False)
    state = {"w%d" % i: torch.full((1 << 18,), float(i)) for i in range(16)}   # 16 MiB
    for i in range(3):
        p = tmp_path / ("k%d.ckpt" % i)
        io.save_checkpoint(state, p)
        state["w0"].add_(1)                 # the copy was taken: this is not saved
        io.remove_checkpoint(p)
        assert not p.exists()
    q = tmp_path / "kept.ckpt"
    io.save_checkpoint(state, q)
    got = io.load_checkpoint(q)
    assert got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)
    io.teardown()
    assert sorted(os.listdir(tmp_path)) == ["kept.ckpt"]


def test_async_save_error_is_raised(tmp_path, tmpfs):
    """A save that fails in the background (the file system fills) raises at
    teardown, or at a load of its path, once; the old checkpoint stays."""
    import errno
    mnt = tmpfs("small", "size=2m")
    io = NvioCheckpointIO(asynchronous=True, durable=False)
    p = mnt / "a.ckpt"
    io.save_checkpoint({"w": torch.ones(4)}, p)
    io.save_checkpoint({"w": torch.ones(1 << 20)}, p)          # 4 MiB: ENOSPC
    with pytest.raises(OSError) as ei:
        io.teardown()
    assert ei.value.errno == errno.ENOSPC and "a.ckpt" in str(ei.value)
    io.teardown()                           # raised once
    assert torch.equal(nvio.load(str(p))["w"], torch.ones(4))
    io.save_checkpoint({"w": torch.ones(1 << 20)}, p)
    with pytest.raises(OSError, match="a.ckpt"):
        io.load_checkpoint(p)               # waits for the save of p: its error
    assert torch.equal(io.load_checkpoint(p)["w"], torch.ones(4))
    io.teardown()
    assert os.listdir(mnt) == ["a.ckpt"]


def test_async_pool_bytes_bounds_the_copies(tmp_path, engine):
    """pool_bytes: the copies of queued saves stay within it (a save waits
    for an earlier one to be written; each file is whole and holds what
    was saved, the state changed right after each call), a save larger
    than the bound is refused naming pool_bytes, before anything is
    written; pool_bytes without asynchronous=True, or not > 0, is refused."""
    import threading
    io = NvioCheckpointIO(handle=nvio.AioHandle(engine=engine), asynchronous=True,
                          durable=False, pool_bytes=6 << 20)
    state = {"w": torch.zeros(1 << 20)}     # 4 MiB: one copy fits, two do not
    most = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            w = io._writer
            if w is not None:
                most[0] = max(most[0], w._held)
            stop.wait(0.0005)
    t = threading.Thread(target=watch)
    t.start()
    try:
        for i in range(4):
            state["w"].fill_(float(i))
            io.save_checkpoint(state, tmp_path / ("c%d.ckpt" % i))
        state["w"].fill_(-1.0)
        with pytest.raises(ValueError, match="pool_bytes"):
            io.save_checkpoint({"w": torch.zeros(2 << 20)}, tmp_path / "big.ckpt")
        io.teardown()
    finally:
        stop.set()
        t.join(10)
    assert 0 < most[0] <= 6 << 20
    for i in range(4):
        assert torch.equal(nvio.load(str(tmp_path / ("c%d.ckpt" % i)))["w"],
                           torch.full((1 << 20,), float(i)))
    assert sorted(os.listdir(tmp_path)) == ["c%d.ckpt" % i for i in range(4)]
    with pytest.raises(ValueError, match="asynchronous=True"):
        NvioCheckpointIO(pool_bytes=1 << 20)
    with pytest.raises(ValueError, match="> 0"):
        NvioCheckpointIO(asynchronous=True, pool_bytes=0)

def test_remove_checkpoint_and_errors(tmp_path):
    io = NvioCheckpointIO(durable=False)
    p = tmp_path / "sub" / "a.ckpt"
    io.save_checkpoint({"w": torch.arange(10.0)}, p, storage_options={"spare": True})
    assert torch.equal(io.load_checkpoint(p)["w"], torch.arange(10.0))
    io.remove_checkpoint(p)
    assert not p.exists()
    io.remove_checkpoint(p)                     # gone already: no error, as Lightning's
    with pytest.raises(FileNotFoundError, match="a.ckpt"):
        io.load_checkpoint(p)
    with pytest.raises(TypeError, match="bogus"):
        io.save_checkpoint({}, p, storage_options={"bogus": 1})
    with pytest.raises(ValueError, match="local path"):
        io.save_checkpoint({}, "s3://bucket/a.ckpt")
    assert not p.exists()
