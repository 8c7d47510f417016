"""nvio.integrations.transformers: Hugging Face Trainer checkpoints written
and read through nvio; resumed training equal to the stock Trainer's."""
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import nvio  # noqa: E402
import nvio.integrations.transformers as nvtr  # noqa: E402

STEPS, SAVE = 6, 3


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: on a machine whose cores are all busy, torch's
    spinning threads make each step tens of times slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _model():
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=97, n_positions=32)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def _data():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 97, (24, 16), generator=g)
    return [{"input_ids": r, "labels": r} for r in ids]


def _trainer(out, hook=None, **kw):
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=STEPS, save_steps=SAVE, save_strategy="steps",
        per_device_train_batch_size=4, learning_rate=1e-3, lr_scheduler_type="linear",
        warmup_steps=1, use_cpu=True, report_to=[], logging_strategy="no", seed=7,
        disable_tqdm=True, save_only_model=False, **kw)
    t = transformers.Trainer(model=_model(), args=args, train_dataset=_data())
    if hook is not None:
        t.nvio_hook = nvtr.use_nvio(t, **hook)
    return t


def _weights(t):
    return {k: v.detach().clone() for k, v in t.model.state_dict().items()}


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _same_opt(a, b):
    assert a["param_groups"] == b["param_groups"]
    for i in a["state"]:
        for k in a["state"][i]:
            assert torch.equal(torch.as_tensor(a["state"][i][k]),
                               torch.as_tensor(b["state"][i][k])), (i, k)


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    """The stock Trainer: uninterrupted, and its checkpoint-3."""
    out = tmp_path_factory.mktemp("stock")
    t = _trainer(out)
    t.train()
    return out, _weights(t), t.optimizer.state_dict()


def _read_by_nvio(monkeypatch):
    calls = []
    for name in ("load",):
        real = getattr(nvtr, name)
        monkeypatch.setattr(nvtr, name, lambda *a, _r=real, **k: (calls.append(a[0]), _r(*a, **k))[1])
    real_st = nvtr._nst.load_file
    monkeypatch.setattr(nvtr._nst, "load_file",
                        lambda *a, **k: (calls.append(a[0]), real_st(*a, **k))[1])
    return calls


def test_checkpoint_and_resume_equal_stock(tmp_path, stock, engine, monkeypatch):
    out_stock, w_stock, opt_stock = stock
    h = nvio.AioHandle(engine=engine)
    t = _trainer(tmp_path / "a", hook={"handle": h})
    t.train()
    _same(_weights(t), w_stock)                         # saving changed nothing
    for step in (SAVE, STEPS):
        ck, ck_stock = (d / f"checkpoint-{step}" for d in (tmp_path / "a", out_stock))
        # the weights file: the very bytes safetensors wrote for the stock Trainer
        assert (ck / "model.safetensors").read_bytes() == (ck_stock / "model.safetensors").read_bytes()
        for name in ("optimizer.pt", "scheduler.pt"):
            assert _written_by_nvio_save(ck / name), name
            a, b = (torch.load(str(d / name), weights_only=True) for d in (ck, ck_stock))
            if name == "optimizer.pt":
                _same_opt(a, b)
            else:
                assert a == b
    # resume from nvio's checkpoint-3 through nvio: the stock run's end state
    calls = _read_by_nvio(monkeypatch)
    r = _trainer(tmp_path / "b", hook={"handle": h})
    r.train(resume_from_checkpoint=str(tmp_path / "a" / f"checkpoint-{SAVE}"))
    assert sorted(os.path.basename(c) for c in calls) == [
        "model.safetensors", "optimizer.pt", "scheduler.pt"], calls
    assert r.state.global_step == STEPS
    _same(_weights(r), w_stock)
    _same_opt(r.optimizer.state_dict(), opt_stock)


def test_stock_and_nvio_resume_from_each_other(tmp_path, stock):
    out_stock, w_stock, _ = stock
    r = _trainer(tmp_path / "r1", hook={"durable": False})
    r.train(resume_from_checkpoint=str(out_stock / f"checkpoint-{SAVE}"))
    _same(_weights(r), w_stock)
    ck = tmp_path / "r1" / f"checkpoint-{STEPS}"
    assert _written_by_nvio_save(ck / "optimizer.pt")
    # the stock Trainer resumes from nvio's files (trained 6 of 6: nothing to do)
    s = _trainer(tmp_path / "r2")
    s.train(resume_from_checkpoint=str(ck))
    _same(_weights(s), w_stock)


def test_remove_puts_the_trainer_back(tmp_path):
    import transformers.modeling_utils as mu
    import transformers.trainer as tm
    before = (mu.safe_save_file, tm.safetensors)
    t = _trainer(tmp_path)
    hook = nvtr.use_nvio(t)
    with pytest.raises(RuntimeError, match="already set"):
        nvtr.use_nvio(t)
    t.save_model(str(tmp_path / "m"))
    assert (mu.safe_save_file, tm.safetensors) == before     # swapped only during the call
    hook.remove()
    assert not any(m in vars(t) for m in nvtr._METHODS)
    assert type(t)._save is transformers.Trainer._save
    with pytest.raises(TypeError, match="Trainer"):
        nvtr.use_nvio(object())


def test_errors_name_the_file(tmp_path):
    t = _trainer(tmp_path / "o", hook={})
    t.train()
    ck = tmp_path / "o" / f"checkpoint-{SAVE}"
    with open(ck / "optimizer.pt", "r+b") as f:
        f.truncate(100)
    r = _trainer(tmp_path / "p", hook={})
    with pytest.raises(Exception, match="optimizer.pt"):
        r.train(resume_from_checkpoint=str(ck))


def _written_by_nvio_save(path):
    """nvio.save marks its files with a .data/nvio_format record."""
    import zipfile
    with zipfile.ZipFile(path) as z:
        return any(n.endswith("/.data/nvio_format") for n in z.namelist())
