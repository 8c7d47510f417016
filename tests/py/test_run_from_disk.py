"""nvio.offload.run_from_disk: block weights read from disk as the blocks run.

Every model family (Llama-, GPT-2-, Mixtral-style transformers built from
tiny configs with random weights, and a generic nn.Sequential stack) gives
bitwise the same logits and greedy generations streamed as in memory, on
every engine, from safetensors (one file and shards) and from nvio's own
store, with prefetch 0, 1 and 2; the resident weight memory is what the
streamer states; bad input fails with errors naming the file and layer.
"""
import json
import os

import pytest

import nvio
import nvio_testutil

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch import nn  # noqa: E402

from nvio.offload import (WeightReadError, run_from_disk, run_from_memory,  # noqa: E402
                          running_from_disk)

transformers.logging.set_verbosity_error()
try:
    transformers.utils.logging.disable_progress_bar()
except AttributeError:
    pass


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny matrices: torch's thread pool only fights the other jobs of a
    shared 2-core machine (a forward took 40x longer with it)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _config(family):
    c = dict(vocab_size=96, num_attention_heads=4)
    if family == "llama":
        return transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=5,
                                        num_key_value_heads=2, **c)
    if family == "gpt2":
        return transformers.GPT2Config(n_embd=32, n_layer=5, n_head=4, vocab_size=96,
                                       bos_token_id=0, eos_token_id=0)
    return transformers.MixtralConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                      num_key_value_heads=2, num_local_experts=4,
                                      num_experts_per_tok=2, **c)


def _model(family, seed=0):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(_config(family)).eval()


PROMPTS = [torch.tensor([[5, 17, 3, 44]]), torch.tensor([[1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4, 3]])]


def _run(m):
    with torch.no_grad():
        logits = [m(p).logits for p in PROMPTS]
        # two prompts in one batch: greedy decoding of several prompts at once
        gen = [m.generate(PROMPTS[1], max_new_tokens=5, do_sample=False, pad_token_id=0)]
    return logits, gen


def _same(a, b):
    return nvio_testutil.same(a[0] + a[1], b[0] + b[1])


def _materialised_bytes(model):
    return sum(t.numel() * t.element_size()
               for t in list(model.parameters()) + list(model.buffers())
               if t.device.type != "meta")


@pytest.mark.parametrize("family", ["llama", "gpt2", "mixtral"])
def test_families_equal_in_memory(tmp_path, engine, family):
    m = _model(family)
    ref = _run(m)
    full = _materialised_bytes(m)
    st = tmp_path / "hf"
    m.save_pretrained(st)
    combos = [("store", 0), ("safetensors", 1), ("store", 2)]
    if family == "mixtral":
        combos = [("store", 0), ("store", 2)]
    for src, prefetch in combos:
        d = st if src == "safetensors" else tmp_path / "store"
        run_from_disk(m, str(d), prefetch=prefetch, source=src, engine=engine)
        s = m._nvio_from_disk.stats()
        assert s["source"] == src and s["slots"] == prefetch + 1
        assert s["resident_bytes"] + s["streamed_bytes"] == full
        # outside a forward, only the resident tensors are materialised
        assert _materialised_bytes(m) == s["resident_bytes"]
        assert _same(_run(m), ref), (family, src, prefetch)
        assert m._nvio_from_disk.stats()["bytes_read"] > 0
        run_from_memory(m)
        assert _materialised_bytes(m) == full
    assert _same(_run(m), ref)
    if family == "mixtral":
        # transformers 5 fuses Mixtral's experts in memory and saves them
        # per expert: auto falls back to nvio's store, "safetensors" says why
        with pytest.raises(ValueError, match="model.layers.0.mlp.* is in none of the files"):
            run_from_disk(m, str(st), source="safetensors", engine=engine)
        with running_from_disk(m, str(st), engine=engine) as sm:
            assert sm._nvio_from_disk.source == "store"
            assert _same(_run(sm), ref)


def test_sharded_safetensors_into_a_meta_model(tmp_path, engine):
    """A model built without weights streams straight from save_pretrained
    shards: its blocks are never materialised, its resident parts are read."""
    accelerate = pytest.importorskip("accelerate")
    m = _model("llama", seed=3)
    ref = _run(m)
    m.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    shards = [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]
    assert len(shards) > 2
    with accelerate.init_empty_weights(include_buffers=False):
        e = transformers.AutoModelForCausalLM.from_config(_config("llama")).eval()
    assert all(p.device.type == "meta" for p in e.parameters())
    run_from_disk(e, str(tmp_path), prefetch=1, engine=engine)
    s = e._nvio_from_disk.stats()
    assert s["source"] == "safetensors" and len(s["files"]) > 1
    assert _same(_run(e), ref)
    # no rewrite: nvio wrote nothing beside the shards
    assert not (tmp_path / "nvio-weights.bin").exists()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.norm = nn.LayerNorm(d)
        self.register_buffer("scale", torch.rand(d))

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x)))) * self.scale


def _stack(seed=0, d=48, n=7):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, d), *[Block(d) for _ in range(n)], nn.Linear(d, 8)).eval()


def test_generic_sequential_and_memory_bound(tmp_path, engine):
    m = _stack()
    x = torch.randn(5, 16)
    with torch.no_grad():
        ref = m(x)
    full = _materialised_bytes(m)
    block_bytes = _materialised_bytes(m[1])
    for prefetch in (0, 1, 2):
        run_from_disk(m, str(tmp_path), prefetch=prefetch, engine=engine)
        st = m._nvio_from_disk
        assert [b.name for b in st.blocks] == [str(i) for i in range(1, 8)]
        s = st.stats()
        assert s["resident_bytes"] == full - 7 * block_bytes
        assert s["slot_bytes"] >= block_bytes and s["pool_bytes"] == (prefetch + 1) * s["slot_bytes"]
        assert s["peak_weight_bytes"] == s["resident_bytes"] + s["pool_bytes"]
        # while a block runs: the resident tensors and that one block
        seen = []
        hooks = [b.module.register_forward_pre_hook(
            lambda mod, a: seen.append(_materialised_bytes(m))) for b in st.blocks]
        owners = []
        hooks += [b.module.register_forward_hook(
            lambda mod, a, o: owners.append(sum(s.owner is not None for s in st.slots)))
            for b in st.blocks]
        with torch.no_grad():
            for _ in range(3):
                assert torch.equal(m(x), ref)
        for h in hooks:
            h.remove()
        assert seen == [s["resident_bytes"] + block_bytes] * 21
        assert max(owners) <= prefetch + 1
        # each pass reads every block once, and the next pass's first
        # prefetch + 1 blocks after the last one
        assert st.stats()["block_reads"] == 21 + prefetch + 1
        run_from_memory(m)
    with torch.no_grad():
        assert torch.equal(m(x), ref)


def test_blocks_named_and_pinned(tmp_path, engine):
    m = _stack(seed=1)
    x = torch.randn(3, 16)
    with torch.no_grad():
        ref = m(x)
    run_from_disk(m, str(tmp_path), blocks=["2", "4", "6"], pin=["4.fc1"], engine=engine)
    st = m._nvio_from_disk
    assert [b.name for b in st.blocks] == ["2", "4", "6"]
    assert m[4].fc1.weight.device.type == "cpu" and m[4].fc2.weight.device.type == "meta"
    assert m[3].fc1.weight.device.type == "cpu"
    with torch.no_grad():
        assert torch.equal(m(x), ref)
    run_from_memory(m)
    with pytest.raises(ValueError, match="ModuleList or Sequential"):
        run_from_disk(m, str(tmp_path), blocks="1")


def test_a_block_with_nothing_to_stream_is_dropped_and_the_rest_renumbered(tmp_path, engine):
    """A named block that holds no streamed tensor (here: pinned whole) is
    dropped; the prefetch after each block must then fetch the next block
    that remains, not the one at the dropped numbering's position."""
    m = _stack(seed=4)
    x = torch.randn(3, 16)
    with torch.no_grad():
        ref = m(x)
    for prefetch in (1, 2):
        run_from_disk(m, str(tmp_path), blocks=["2", "3", "4", "5", "6"], pin=["3"],
                     prefetch=prefetch, engine=engine)
        st = m._nvio_from_disk
        assert [b.name for b in st.blocks] == ["2", "4", "5", "6"]
        assert m[3].fc1.weight.device.type == "cpu"
        with torch.no_grad():
            for _ in range(3):
                assert torch.equal(m(x), ref)
        # every block read once per pass, plus the next pass's first
        # prefetch + 1: no block fetched out of turn
        assert st.stats()["block_reads"] == 3 * 4 + prefetch + 1, st.stats()
        run_from_memory(m)


def test_store_reused_and_invalidated(tmp_path, engine):
    m = _stack(seed=2)
    x = torch.randn(3, 16)
    data, man = tmp_path / "nvio-weights.bin", tmp_path / "nvio-weights.json"
    with running_from_disk(m, str(tmp_path), engine=engine):
        pass
    st1 = os.stat(data)
    with running_from_disk(m, str(tmp_path), engine=engine):       # reused, not rewritten
        pass
    st2 = os.stat(data)
    assert (st1.st_ino, st1.st_mtime_ns) == (st2.st_ino, st2.st_mtime_ns)
    assert st1.st_size % 4096 == 0
    for b in json.loads(man.read_text())["blocks"]:
        assert b["offset"] % 4096 == 0
    with torch.no_grad():
        m[3].fc1.weight[0, 0] += 1          # the model changed: the store is rewritten
        ref = m(x)
    with running_from_disk(m, str(tmp_path), engine=engine):
        with torch.no_grad():
            assert torch.equal(m(x), ref)
    assert os.stat(data).st_ino != st1.st_ino
    # a model of another shape never uses this store; one without weights is refused
    other = _stack(seed=2, d=32)
    with torch.device("meta"):
        empty = _stack(seed=2, d=32)
    with pytest.raises(ValueError, match="another model"):
        run_from_disk(empty, str(tmp_path), engine=engine)
    assert not hasattr(empty, "_nvio_from_disk")
    # the right model on the meta device is filled from the store
    with torch.device("meta"):
        empty = _stack(seed=2)
    run_from_disk(empty, str(tmp_path), engine=engine)
    with torch.no_grad():
        assert torch.equal(empty(x), ref)
    run_from_memory(empty)
    with torch.no_grad():
        assert torch.equal(empty(x), ref)
    with running_from_disk(other, str(tmp_path / "o"), engine=engine):
        pass
    # a store whose data file was replaced is noticed
    blob = bytearray(data.read_bytes())
    blob[:64] = bytes(64)
    data.write_bytes(bytes(blob))
    with torch.device("meta"):
        empty = _stack(seed=2)
    with pytest.raises(ValueError, match="does not hold what its manifest says"):
        run_from_disk(empty, str(tmp_path), engine=engine)


def test_truncated_file_names_file_and_layer(tmp_path, engine):
    m = _model("llama", seed=4)
    m.save_pretrained(tmp_path)
    p = tmp_path / "model.safetensors"
    run_from_disk(m, str(tmp_path), prefetch=0, engine=engine)
    with torch.no_grad():
        m(PROMPTS[0])
    os.truncate(p, os.path.getsize(p) // 2)
    with pytest.raises(WeightReadError) as ei:
        with torch.no_grad():
            m(PROMPTS[0])
    msg = str(ei.value)
    assert str(p) in msg and "model.layers." in msg
    assert m._nvio_from_disk.running == set()
    restore_err = None
    try:
        run_from_memory(m)
    except WeightReadError as e:
        restore_err = e
    assert restore_err is not None
    # a truncated file is refused up front by the next run_from_disk
    with pytest.raises(ValueError, match="truncated"):
        run_from_disk(_model("llama", seed=4), str(tmp_path), source="safetensors", engine=engine)


def test_read_error_mid_generation(tmp_path, engine):
    """A failed read (injected into the completions of one block's read)
    fails the forward with the layer and file; the next forward reads again."""
    m = _model("gpt2", seed=5)
    ref = _run(m)
    # explicit: direct="auto" could change handles (and so st.comps) mid-way
    run_from_disk(m, str(tmp_path), prefetch=1, engine=engine, direct=False)
    st = m._nvio_from_disk
    real = st.comps.submit
    calls = {"n": 0}

    def failing(ops, **kw):
        calls["n"] += 1
        futs = real(ops, **kw)
        if calls["n"] == 4:
            for f in futs:
                f.result()
            bad = nvio.NvioFuture()
            bad.set_exception(nvio.NvioError(5, "Input/output error", ops[0][1].path))
            return [bad] + futs[1:]
        return futs

    st.comps.submit = failing
    with pytest.raises(WeightReadError) as ei:
        with torch.no_grad():
            m.generate(PROMPTS[1], max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert ei.value.errno == 5
    assert "transformer.h." in str(ei.value) and "nvio-weights.bin" in str(ei.value)
    assert _same(_run(m), ref)
    run_from_memory(m)


def test_bad_arguments(tmp_path):
    m = _stack(seed=6)
    with pytest.raises(ValueError, match="too small for one block"):
        run_from_disk(m, str(tmp_path), pool_bytes=1000)
    assert not hasattr(m, "_nvio_from_disk")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            run_from_disk(m, str(tmp_path), device="cuda")
    with pytest.raises(ValueError, match="prefetch"):
        run_from_disk(m, str(tmp_path), prefetch=-1)
    with pytest.raises(ValueError, match="needs dir"):
        run_from_disk(m)
    # a pool for two blocks lowers the prefetch to 1
    blk = _materialised_bytes(m[1])
    run_from_disk(m, str(tmp_path), prefetch=4, pool_bytes=2 * ((blk + 8191) // 4096 * 4096))
    assert m._nvio_from_disk.prefetch == 1
    with pytest.raises(RuntimeError, match="already"):
        run_from_disk(m, str(tmp_path))
    x = torch.randn(2, 16, requires_grad=True)
    with pytest.raises(RuntimeError, match="inference only"):
        m(x)
    run_from_memory(m)
    with pytest.raises(ValueError, match="not run from disk"):
        run_from_memory(m)


def test_generate_command(tmp_path, capsys):
    """python -m nvio.offload.generate streams a save_pretrained directory
    into a model built on the meta device and generates what memory does."""
    pytest.importorskip("accelerate")
    from nvio.offload import generate
    m = _model("llama", seed=7)
    m.save_pretrained(tmp_path)
    prompt = "stream me"
    ids = torch.tensor([[b % 96 for b in prompt.encode()]])
    with torch.no_grad():
        ref = m.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False,
                         pad_token_id=0)[0, ids.shape[1]:].tolist()
    assert generate.main(["--config", str(tmp_path), "--prompt", prompt, "--tokens", "5",
                          "--prefetch", "2"]) == 0
    out = capsys.readouterr().out
    assert "tokens: %s\n" % " ".join(map(str, ref)) in out
    assert "tokens/s" in out and "GB/s" in out and "peak resident weight memory" in out
    assert "source: safetensors" in out
    assert "\nreads: O_DIRECT (" in out or "\nreads: through the page cache (" in out


def test_layouts():
    """The pure layout functions: aligned supersets of runs, views at the
    right offsets, the file's end, misaligned tensors read exactly."""
    from nvio.offload import _weights as W
    f32 = torch.float32
    E = W.StEntry
    entries = {  # file a: two neighbours, one far away, one at the end; file b: misaligned
        "x": E("a", f32, (10,), 8200, 8240), "y": E("a", f32, (3,), 8240, 8252),
        "z": E("a", f32, (1000,), 200000, 204000), "w": E("a", f32, (2,), 204000, 204008),
        "m": E("b", f32, (4,), 4098, 4114),
    }
    lay = W.layout_safetensors([(n, f32, entries[n].shape) for n in "xyzwm"], entries,
                               {"a": 204008, "b": 5000})
    assert lay.reads["a"] == [(0, 8192, 4096), (4096, 196608, 204008 - 196608)]
    assert lay.reads["b"] == [(12288, 4098, 16)]           # exact: 4098 % 4 != 0
    assert [(lay.slices[n].off, lay.slices[n].nbytes) for n in "xyzwm"] == [
        (8, 40), (48, 12), (4096 + 200000 - 196608, 4000), (4096 + 204000 - 196608, 8),
        (12288, 16)]
    assert lay.size == 16384
    for so, fo, n in lay.reads["a"]:
        assert so % 4096 == 0 and fo % 4096 == 0
    store, size = W.layout_store([[("a", f32, (3,)), ("b", torch.bfloat16, (5, 7))],
                                  [("c", torch.int64, (0,))], []])
    assert [off for off, _ in store] == [0, 4096, 4096] and size == 4096
    assert store[0][1].slices["b"].off == 64 and store[0][1].size == 4096
    assert store[1][1].size == 0


# --- direct="auto": page cache when the model fits in it, else O_DIRECT -----

GiB = 1 << 30


def _fake(root, meminfo_kb=None, cgroup=None, files=None, mountinfo=None):
    """A fake /proc and /sys/fs/cgroup under root for _room.page_cache_room."""
    (root / "proc/self").mkdir(parents=True, exist_ok=True)
    if meminfo_kb is not None:
        (root / "proc/meminfo").write_text(
            "MemTotal:       99999999 kB\nMemFree:        1 kB\nMemAvailable:   %d kB\n"
            % meminfo_kb)
    if cgroup is not None:
        (root / "proc/self/cgroup").write_text(cgroup)
    if mountinfo is not None:
        (root / "proc/self/mountinfo").write_text(mountinfo)
    for path, text in (files or {}).items():
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(root)


V1 = "9:name=systemd:/\n4:memory:%s\n1:cpu:/\n0::/\n"
HUGE = "9223372036854771712\n"


def test_room_no_limit_lots_of_memory(tmp_path):
    from nvio.offload import _room as R
    root = _fake(tmp_path, meminfo_kb=64 << 20, cgroup=V1 % "/job",
                 files={"sys/fs/cgroup/memory/memory.limit_in_bytes": HUGE,
                        "sys/fs/cgroup/memory/memory.usage_in_bytes": "%d\n" % (5 * GiB),
                        "sys/fs/cgroup/memory/job/memory.limit_in_bytes": HUGE,
                        "sys/fs/cgroup/memory/job/memory.usage_in_bytes": "%d\n" % GiB})
    r = R.page_cache_room(root)
    assert r["error"] is None and r["cgroup"] == "v1 /job" and r["cgroup_room"] is None
    assert r["room"] == r["mem_available"] == 64 * GiB
    direct, why, inp = R.choose_direct(10 * GiB, GiB, root=root)
    assert direct is False and why.startswith("page cache:") and "no limit" in why
    assert inp["need"] == 11 * GiB + R.MARGIN_MIN + 10 * GiB // R.MARGIN_DIV
    # the margin counts: streamed bytes just under MemAvailable do not fit
    assert R.choose_direct(63 * GiB, 0, root=root)[0] is True


def test_room_cgroup_v1_limit(tmp_path):
    from nvio.offload import _room as R
    lim = "sys/fs/cgroup/memory/grp/job/memory.limit_in_bytes"
    files = {lim: "%d\n" % (3 * GiB),
             "sys/fs/cgroup/memory/grp/job/memory.usage_in_bytes": "%d\n" % GiB,
             "sys/fs/cgroup/memory/grp/memory.limit_in_bytes": HUGE,
             "sys/fs/cgroup/memory/grp/memory.usage_in_bytes": "%d\n" % GiB,
             "sys/fs/cgroup/memory/memory.limit_in_bytes": HUGE,
             "sys/fs/cgroup/memory/memory.usage_in_bytes": "7\n"}
    root = _fake(tmp_path, meminfo_kb=64 << 20, cgroup=V1 % "/grp/job", files=files)
    r = R.page_cache_room(root)
    assert (r["cgroup_limit"], r["cgroup_usage"], r["cgroup_room"], r["room"]) == (
        3 * GiB, GiB, 2 * GiB, 2 * GiB)
    direct, why, _ = R.choose_direct(6 * GiB, 256 << 20, root=root)   # limit < the bytes
    assert direct is True and why.startswith("O_DIRECT:") and "limit 3.00 GiB" in why
    assert R.choose_direct(512 << 20, 64 << 20, root=root)[0] is False
    # an ancestor's limit binds when it leaves less room
    (tmp_path / "sys/fs/cgroup/memory/grp/memory.limit_in_bytes").write_text("%d\n" % (GiB + 5))
    r = R.page_cache_room(root)
    assert (r["cgroup_limit"], r["cgroup_room"], r["room"]) == (GiB + 5, 5, 5)
    assert R.choose_direct(1, 0, root=root)[0] is True
    # found through mountinfo (a container: the mount's root is the group itself)
    box = tmp_path / "box"
    mi = ("30 25 0:27 /grp/job /sys/fs/cgroup/mem\\040ory rw,nosuid - cgroup cgroup "
          "rw,memory\n31 25 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")
    root = _fake(box, meminfo_kb=64 << 20, cgroup=V1 % "/grp/job", mountinfo=mi,
                 files={"sys/fs/cgroup/mem ory/memory.limit_in_bytes": "%d\n" % (2 * GiB),
                        "sys/fs/cgroup/mem ory/memory.usage_in_bytes": "%d\n" % (GiB // 2)})
    r = R.page_cache_room(root)
    assert r["error"] is None and r["room"] == GiB * 3 // 2


def test_room_counts_weights_cached_already(tmp_path):
    """A cgroup's usage includes the model's own cached pages: a second run
    in the same group must not take them for a lack of room."""
    from nvio.offload import _room as R
    files = {"sys/fs/cgroup/memory/job/memory.limit_in_bytes": "%d\n" % (2 * GiB),
             "sys/fs/cgroup/memory/job/memory.usage_in_bytes": "%d\n" % (GiB * 3 // 2),
             "sys/fs/cgroup/memory/memory.limit_in_bytes": HUGE,
             "sys/fs/cgroup/memory/memory.usage_in_bytes": "1\n"}
    root = _fake(tmp_path, meminfo_kb=64 << 20, cgroup=V1 % "/job", files=files)
    direct, why, _ = R.choose_direct(GiB, 0, root=root)
    assert direct is True and "= 512.0 MiB" in why
    direct, why, inp = R.choose_direct(GiB, 0, root=root, cached=GiB)
    assert direct is False and "+ 1.00 GiB of the weights cached = 1.50 GiB" in why
    assert inp["room"] == GiB * 3 // 2
    # MemAvailable already counts page cache as available: nothing added there
    root = _fake(tmp_path / "nolimit", meminfo_kb=1 << 20, cgroup=V1 % "/",
                 files={k: v for k, v in files.items() if "/job/" not in k})
    assert R.choose_direct(GiB, 0, root=root, cached=GiB)[0] is True
    # mincore: a file just written is in the page cache, a missing one is not
    p = tmp_path / "w.bin"
    p.write_bytes(os.urandom(1 << 20))
    got = R.cached_bytes([(str(p), 0, 1 << 20), (str(tmp_path / "none"), 0, 4096)])
    assert got == 1 << 20
    assert R.cached_bytes([(str(p), 4096, 8192)]) == 8192


def test_room_cgroup_v2(tmp_path):
    from nvio.offload import _room as R
    root = _fake(tmp_path, meminfo_kb=8 << 20, cgroup="0::/user.slice/app.scope\n",
                 mountinfo="28 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
                 files={"sys/fs/cgroup/user.slice/app.scope/memory.max": "max\n",
                        "sys/fs/cgroup/user.slice/app.scope/memory.current": "%d\n" % GiB,
                        "sys/fs/cgroup/user.slice/memory.max": "max\n",
                        "sys/fs/cgroup/user.slice/memory.current": "%d\n" % GiB})
    # 'max' everywhere (the root group has no memory.max): MemAvailable decides
    r = R.page_cache_room(root)
    assert r["error"] is None and r["cgroup"] == "v2 /user.slice/app.scope"
    assert r["cgroup_room"] is None and r["room"] == 8 * GiB
    assert R.choose_direct(4 * GiB, 0, root=root)[0] is False
    assert R.choose_direct(9 * GiB, 0, root=root)[0] is True
    (tmp_path / "sys/fs/cgroup/user.slice/app.scope/memory.max").write_text("%d\n" % (2 * GiB))
    r = R.page_cache_room(root)
    assert (r["cgroup_room"], r["room"]) == (GiB, GiB)
    assert R.choose_direct(4 * GiB, 0, root=root)[0] is True


def test_room_unreadable_means_direct(tmp_path):
    from nvio.offload import _room as R
    ok = {"sys/fs/cgroup/memory/job/memory.limit_in_bytes": HUGE,
          "sys/fs/cgroup/memory/job/memory.usage_in_bytes": "1\n",
          "sys/fs/cgroup/memory/memory.limit_in_bytes": HUGE,
          "sys/fs/cgroup/memory/memory.usage_in_bytes": "1\n"}
    cases = {
        "no meminfo": dict(cgroup=V1 % "/job", files=ok),
        "no /proc/self/cgroup": dict(meminfo_kb=64 << 20, files=ok),
        "no group directory": dict(meminfo_kb=64 << 20, cgroup=V1 % "/other", files=ok),
        "a limit that is no number": dict(
            meminfo_kb=64 << 20, cgroup=V1 % "/job",
            files=dict(ok, **{"sys/fs/cgroup/memory/job/memory.limit_in_bytes": "lots\n"})),
        "a limit without its usage": dict(
            meminfo_kb=64 << 20, cgroup=V1 % "/job",
            files={k: "%d\n" % GiB if "job/memory.limit" in k else v
                   for k, v in ok.items() if "job/memory.usage" not in k}),
    }
    for i, (what, kw) in enumerate(cases.items()):
        root = _fake(tmp_path / str(i), **kw)
        r = R.page_cache_room(root)
        assert r["room"] is None and r["error"], what
        direct, why, _ = R.choose_direct(1, 0, root=root)
        assert direct is True and "unknown" in why, what
    root = _fake(tmp_path / "m", cgroup="0::/\n", files={"proc/meminfo": "MemTotal: 5 kB\n"})
    assert "no MemAvailable" in R.page_cache_room(root)["error"]
    # the whole tree missing
    assert R.choose_direct(1, 0, root=str(tmp_path / "nothing"))[0] is True


def _room_is(monkeypatch, room):
    """page_cache_room says room; the page cache keeps every weight read
    (mincore is not asked: another job dropping caches would change it)."""
    from nvio.offload import _room as R
    monkeypatch.setattr(R, "cached_bytes", lambda ranges: sum(n for _p, _o, n in ranges))
    monkeypatch.setattr(R, "page_cache_room", lambda root="/": dict(
        room=room, mem_available=room, cgroup=None, cgroup_room=None, cgroup_limit=None,
        cgroup_usage=None, error=None))


def test_explicit_direct_wins(tmp_path, monkeypatch):
    import nvio as nv
    m = _stack(seed=8)
    x = torch.randn(3, 16)
    with torch.no_grad():
        ref = m(x)
    o_direct_ok = nv.probe(str(tmp_path))["direct_ok"]
    cases = [(100 * GiB, "auto", False, "page cache:"), (0, "auto", True, "O_DIRECT:"),
             (0, False, False, "direct=False given"), (0, "off", False, "direct='off' given")]
    if o_direct_ok:
        cases.append((100 * GiB, True, True, "direct=True given"))
    for room, direct, want, why in cases:
        _room_is(monkeypatch, room)
        run_from_disk(m, str(tmp_path), direct=direct)
        with torch.no_grad():
            assert torch.equal(m(x), ref)
        s = m._nvio_from_disk.stats()
        assert s["direct"] is want and s["why"].startswith(why), (room, direct, s["why"])
        assert s["o_direct"] is (want and o_direct_ok)
        run_from_memory(m)
    # the environment counts as an explicit choice; so does a handle's setting
    _room_is(monkeypatch, 100 * GiB)
    monkeypatch.setenv("NVIO_DIRECT", "on" if o_direct_ok else "off")
    with running_from_disk(m, str(tmp_path)) as sm:
        with torch.no_grad():
            sm(x)
        s = sm._nvio_from_disk.stats()
        assert s["direct"] is o_direct_ok and s["o_direct"] is o_direct_ok
        assert s["why"].startswith("NVIO_DIRECT=")
    monkeypatch.delenv("NVIO_DIRECT")
    with nv.AioHandle(direct=False) as h:
        _room_is(monkeypatch, 0)
        with running_from_disk(m, str(tmp_path), handle=h) as sm:
            with torch.no_grad():
                sm(x)
            s = sm._nvio_from_disk.stats()
            assert s["direct"] is False and s["o_direct"] is False
            assert s["why"] == "the handle given decides (direct=off)"
    with pytest.raises(ValueError, match="direct"):
        run_from_disk(m, str(tmp_path), direct="sometimes")
    assert not hasattr(m, "_nvio_from_disk")


@pytest.mark.parametrize("family", ["llama", "gpt2", "mixtral"])
def test_same_tokens_direct_or_page_cache(tmp_path, monkeypatch, engine, family):
    """Every family on every engine: O_DIRECT forced, the page cache forced,
    and auto deciding each way, all generate what memory generates."""
    import nvio as nv
    m = _model(family, seed=9)
    ref = _run(m)
    m.save_pretrained(tmp_path)
    o_direct_ok = nv.probe(str(tmp_path))["direct_ok"]
    modes = [(None, False), (0, "auto"), (100 * GiB, "auto")]
    if o_direct_ok:
        modes.append((None, True))
    for room, direct in modes:
        if room is not None:
            _room_is(monkeypatch, room)
        run_from_disk(m, str(tmp_path), prefetch=1, engine=engine, direct=direct)
        s = m._nvio_from_disk
        assert _same(_run(m), ref), (family, engine, room, direct)
        st = s.stats()
        assert st["direct"] is (direct is True or room == 0)
        assert st["o_direct"] is (st["direct"] and o_direct_ok)
        assert st["bytes_read"] > 0
        run_from_memory(m)


def test_page_cache_not_keeping_the_model_switches_to_direct(tmp_path, monkeypatch, engine):
    """Page cache chosen, but the weights are not cached when read again
    (mincore says so: memory taken since, caches dropped): from the third
    pass on nvio reads with O_DIRECT, and the outputs stay the same; while
    the cache keeps them, it stays buffered."""
    import nvio as nv
    from nvio.offload import _room as R
    m = _stack(seed=10)
    xs = [torch.randn(3, 16) for _ in range(5)]
    with torch.no_grad():
        ref = [m(x) for x in xs]
    o_direct_ok = nv.probe(str(tmp_path))["direct_ok"]
    _room_is(monkeypatch, 100 * GiB)
    for kept in (True, False):
        monkeypatch.setattr(R, "cached_bytes", lambda ranges: (
            sum(n for _p, _o, n in ranges) if kept else 0))
        run_from_disk(m, str(tmp_path), prefetch=1, engine=engine)
        st = m._nvio_from_disk
        seen = []
        for x, r in zip(xs, ref):
            with torch.no_grad():
                assert torch.equal(m(x), r)
            seen.append((st.stats()["direct"], st.stats()["o_direct"]))
        if kept:
            assert seen == [(False, False)] * 5
        else:
            # passes 1 and 2 buffered; pass 3 finds pass 2 uncached and switches
            assert seen == [(False, False)] * 2 + [(True, o_direct_ok)] * 3
            assert st.stats()["why"].startswith("O_DIRECT since pass 3: the page cache held "
                                                "only 0.0 MiB of the ")
        run_from_memory(m)
    with torch.no_grad():
        assert torch.equal(m(xs[0]), ref[0])
