"""Data-parallel nvio.save / nvio.load over torch.distributed (gloo, loopback).

Each test starts N rank processes (fresh interpreters) that meet through a
TCP store on 127.0.0.1 with a process-group timeout, run one scenario and
print one JSON line; the test kills them if they overrun and checks what
they printed and the file they left, in this process, with plain torch.load.
"""
import os
import re

import pytest

import nvio_testutil
from nvio_testutil import same

import nvio

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

RANK_SCRIPT = r"""
import datetime, errno, json, os, sys
import torch, torch.distributed as dist
import nvio
from nvio.checkpoint import _dist

rank, world, port, d, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                        world_size=world, timeout=datetime.timedelta(seconds=60))
path = os.path.join(d, "ck.pt")

def state(seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(1000, 37, generator=g)
    return {"emb": torch.randn(3000, 64, generator=g),
            "odd": [torch.randn(n, generator=g) for n in (1, 1023, 4097, 65537)],
            "view": base[::7], "base": base, "bf16": torch.randn(777, generator=g).bfloat16(),
            "empty": torch.empty(0), "step": 12}

out = {"rank": rank}
try:
    if mode == "save":
        nvio.save(state(1), path, group=dist.group.WORLD, timeout=30)
        real_bcast, bcasts = dist.broadcast, []
        def counting(*a, **k):
            bcasts.append(1)
            return real_bcast(*a, **k)
        dist.broadcast = counting
        for share in (True, False, "auto"):
            del bcasts[:]
            got = nvio.load(path, group=dist.group.WORLD, share=share)
            out["broadcasts_%s" % share] = len(bcasts)
            ref = state(1)
            out["load_share_%s" % share] = bool(
                torch.equal(got["emb"], ref["emb"]) and torch.equal(got["base"], ref["base"])
                and torch.equal(got["view"], ref["view"]) and got["step"] == 12
                and all(torch.equal(a, b) for a, b in zip(got["odd"], ref["odd"]))
                and got["view"].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr())
    elif mode == "spare":               # three saves: fresh, the spare made, the spare reused
        spare = os.path.join(d, ".ck.pt.nvio-spare")
        ino = lambda q: os.stat(q).st_ino if os.path.exists(q) else None
        out["inodes"] = []
        for seed in (1, 2, 3):
            st = state(seed)
            nvio.save(st, path, group=dist.group.WORLD, spare=True, timeout=30)
            got = nvio.load(path)
            out["inodes"].append([ino(path), ino(spare)])
            out.setdefault("equal", []).append(bool(
                torch.equal(got["emb"], st["emb"]) and torch.equal(got["base"], st["base"])
                and all(torch.equal(a, b) for a, b in zip(got["odd"], st["odd"]))))
            dist.barrier()      # every rank checked before the next save overwrites the spare
        if rank == world - 1:   # a failed share: the old file and the spare stay
            from nvio.checkpoint import _save
            h = _save.default_handle()
            def bad_open(self, p, flags=nvio.FILE_READ):
                raise OSError(errno.ENOSPC, "No space left on device (injected)", p)
            type(h).open = bad_open
        try:
            nvio.save(state(4), path, group=dist.group.WORLD, spare=True, timeout=30)
            out["failed"] = None
        except Exception as e:
            out["failed"] = "%s: %s" % (type(e).__name__, e)
        out["inodes"].append([ino(path), ino(spare)])
    elif mode == "via":                 # shares through a carrier device (NCCL's route)
        nvio.save(state(1), path, group=dist.group.WORLD)
        _dist._carrier = lambda backend: torch.device("cpu")
        got = nvio.load(path, group=dist.group.WORLD, share=True)
        ref = state(1)
        out["equal"] = bool(torch.equal(got["emb"], ref["emb"]) and torch.equal(got["base"], ref["base"])
                            and all(torch.equal(a, b) for a, b in zip(got["odd"], ref["odd"]))
                            and torch.equal(got["bf16"], ref["bf16"]))
    elif mode == "subgroup":            # a group of global ranks 1 and 2 (a DP group in TP x DP)
        sub = dist.new_group([1, 2])
        if rank in (1, 2):
            nvio.save(state(1), path, group=sub, timeout=30)
            got = nvio.load(path, group=sub, share=True)
            ref = state(1)
            out["equal"] = bool(torch.equal(got["emb"], ref["emb"])
                                and all(torch.equal(a, b) for a, b in zip(got["odd"], ref["odd"])))
        dist.barrier()
    elif mode == "ranky":               # the same tensors; non-tensor values of each rank's own
        st = state(1)
        st["who"] = "rank %d" % rank                  # same length, other bytes
        st["tags"] = {"alpha", "beta", "gamma", "delta"}   # a set: order by hash seed
        nvio.save(st, path, group=dist.group.WORLD, timeout=30)
    elif mode == "dtype":               # the same sizes, another dtype on rank 1
        st = state(1)
        if rank == 1:
            st["emb"] = st["emb"].view(torch.int32)
        nvio.save(st, path, group=dist.group.WORLD)
    elif mode == "versions":            # each rank given another version of the file
        mine = os.path.join(d, "v%d.pt" % rank)
        nvio.save(state(1 + rank), mine)
        nvio.load(mine, group=dist.group.WORLD, share=True)
    elif mode == "timeouts":            # the waits that name ranks use the group's timeout
        sub = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=7))
        out["world"] = _dist._Group(dist.group.WORLD, path, None).timeout.total_seconds()
        out["sub"] = _dist._Group(sub, path, None).timeout.total_seconds()
        out["given"] = _dist._Group(sub, path, datetime.timedelta(seconds=3)).timeout.total_seconds()
    elif mode == "writers1":
        nvio.save(state(1), path, group=dist.group.WORLD, writers_per_node=1)
    elif mode == "mismatch":            # a different layout: one more row on rank 1
        st = state(1)
        if rank == 1:
            st["emb"] = torch.randn(3001, 64)
        nvio.save(st, path, group=dist.group.WORLD)
    elif mode == "enospc":
        if rank == world - 1:
            from nvio.checkpoint import _save
            h = _save.default_handle()
            real = type(h).open
            def bad_open(self, p, flags=nvio.FILE_READ):
                raise OSError(errno.ENOSPC, "No space left on device (injected)", p)
            type(h).open = bad_open
        nvio.save(state(1), path, group=dist.group.WORLD)
    elif mode == "die":
        if rank == world - 1:
            real = _dist._write_share
            def die(*a, **k):
                os._exit(3)
            _dist._write_share = die
        nvio.save(state(1), path, group=dist.group.WORLD, timeout=20)
    out["ok"] = True
except Exception as e:
    out["ok"] = False
    out["error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out), flush=True)
os._exit(0)      # no teardown collective with a rank that may be gone
"""


def run_ranks(world, d, mode, timeout=150, engine=None):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if engine:
        env["NVIO_ENGINE"] = engine
    return nvio_testutil.run_ranks(RANK_SCRIPT, world, [d, mode], timeout, env)


def expected_state():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(1000, 37, generator=g)
    return {"emb": torch.randn(3000, 64, generator=g),
            "odd": [torch.randn(n, generator=g) for n in (1, 1023, 4097, 65537)],
            "view": base[::7], "base": base, "bf16": torch.randn(777, generator=g).bfloat16(),
            "empty": torch.empty(0), "step": 12}


@pytest.mark.parametrize("world", [2, 4])
def test_data_parallel_save_is_one_file_torch_loads(tmp_path, world):
    res, outs = run_ranks(world, tmp_path, "save")
    assert len(res) == world, outs
    for r in res.values():
        assert r["ok"], r
        assert r["load_share_True"] and r["load_share_False"] and r["load_share_auto"], r
        # the shares are broadcast; "auto" on one host reads it all on every rank
        assert r["broadcasts_True"] == world and r["broadcasts_auto"] == 0, r
    got = torch.load(tmp_path / "ck.pt", weights_only=True)
    same(expected_state(), got)
    assert got["view"].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr()
    import zipfile
    with zipfile.ZipFile(tmp_path / "ck.pt") as z:
        assert z.testzip() is None
    assert os.listdir(tmp_path) == ["ck.pt"]


def test_data_parallel_spare_saves_reuse_the_old_blocks(tmp_path, engine):
    """spare=True with group: the second save makes the spare, the third
    writes its blocks (its inode becomes the checkpoint's), each file
    torch.loads to its state; a save failing on one rank leaves both the
    checkpoint and the spare as they were."""
    res, outs = run_ranks(2, tmp_path, "spare", engine=engine)
    assert len(res) == 2, outs
    for r in res.values():
        assert r["ok"] and r["equal"] == [True, True, True], r
        assert "CheckpointError" in r["failed"] and "rank 1" in r["failed"], r
        assert "No space left" in r["failed"], r
    (t1, s1), (t2, s2), (t3, s3), (t4, s4) = res[0]["inodes"]
    assert s1 is None                   # a new checkpoint: no spare yet
    assert s2 == t1                     # the first version became the spare
    assert t3 == s2 and s3 == t2        # its blocks hold the third; the second is spare
    assert (t4, s4) == (t3, s3)         # the failed save changed neither
    got = torch.load(tmp_path / "ck.pt", weights_only=True)
    g = torch.Generator().manual_seed(3)
    base = torch.randn(1000, 37, generator=g)
    assert torch.equal(got["base"], base) and got["step"] == 12
    import zipfile
    with zipfile.ZipFile(tmp_path / "ck.pt") as z:
        assert z.testzip() is None
    assert sorted(os.listdir(tmp_path)) == [".ck.pt.nvio-spare", "ck.pt"]


def test_writers_per_node(tmp_path):
    res, outs = run_ranks(2, tmp_path, "writers1")
    assert all(r["ok"] for r in res.values()) and len(res) == 2, outs
    same(expected_state(), torch.load(tmp_path / "ck.pt", weights_only=True))


@pytest.mark.parametrize("mode,word", [("mismatch", "differs"), ("enospc", "rank 1"),
                                       ("die", "")])
def test_failures_fail_every_rank_and_keep_the_old_file(tmp_path, mode, word):
    p = tmp_path / "ck.pt"
    nvio.save({"old": torch.arange(10)}, p)
    before = p.read_bytes()
    res, outs = run_ranks(2, tmp_path, mode)
    alive = [r for r in res.values() if r["rc"] == 0]
    assert alive, outs
    for r in alive:
        assert not r["ok"], r
        assert str(p) in r["error"] and "CheckpointError" in r["error"], r
        assert word in r["error"], r
    if mode == "die":
        assert res.get(1) is None            # it died
        assert re.search(r"\b[Rr]anks? 1\b", res[0]["error"]), res[0]   # named
    assert p.read_bytes() == before
    assert os.listdir(tmp_path) == ["ck.pt"]


def test_load_over_a_subgroup(tmp_path):
    """Save and load with share=True over a group of global ranks 1 and 2:
    each share is broadcast from the global rank holding it."""
    res, outs = run_ranks(3, tmp_path, "subgroup")
    assert len(res) == 3 and all(r["ok"] for r in res.values()), outs
    assert res[1]["equal"] and res[2]["equal"], res
    same(expected_state(), torch.load(tmp_path / "ck.pt", weights_only=True))


def test_non_tensor_values_may_differ_between_ranks(tmp_path):
    """Ranks whose pickles differ where their tensors do not (a per-rank
    string, a set ordered by each process's hash seed) save one file: rank
    0's values, every rank's tensors."""
    env = lambda r: dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED=str(r + 1))
    res, outs = nvio_testutil.run_ranks(RANK_SCRIPT, 2, [tmp_path, "ranky"], 150, env)
    assert len(res) == 2 and all(r["ok"] for r in res.values()), outs
    got = torch.load(tmp_path / "ck.pt", weights_only=False)
    assert got.pop("who") == "rank 0" and got.pop("tags") == {"alpha", "beta", "gamma", "delta"}
    same(expected_state(), got)


@pytest.mark.parametrize("mode,word", [("dtype", "differs"), ("versions", "different checkpoint")])
def test_ranks_disagreeing_are_refused(tmp_path, mode, word):
    """Storages of the same sizes but another dtype on one rank (a save),
    or another version of the file on one rank (a load): refused on every
    rank, naming the file."""
    res, outs = run_ranks(2, tmp_path, mode)
    assert len(res) == 2, outs
    for r in res.values():
        assert not r["ok"] and "CheckpointError" in r["error"] and word in r["error"], r
    if mode == "dtype":
        assert os.listdir(tmp_path) == []


def test_waits_use_the_groups_timeout(tmp_path):
    """A rank that never comes is named after the group's own timeout (60 s
    for the world here, 7 s for a subgroup), not torch's 30-minute default
    of monitored_barrier; a timeout given to the call wins."""
    res, outs = run_ranks(1, tmp_path, "timeouts")
    assert res[0]["ok"], outs
    assert (res[0]["world"], res[0]["sub"], res[0]["given"]) == (60, 7, 3), res


def test_shares_through_a_carrier_device(tmp_path):
    """The route NCCL groups take (copy to the carrier, broadcast, copy
    back), run here with the CPU as the carrier."""
    res, outs = run_ranks(2, tmp_path, "via")
    assert len(res) == 2, outs
    for r in res.values():
        assert r["ok"] and r["equal"], r


def test_which_backends_carry_cpu_tensors():
    from nvio.checkpoint._dist import _carrier
    assert _carrier("gloo") is None and _carrier("mpi") is None
    assert _carrier("nccl") == "cuda"
    assert _carrier("cpu:gloo,cuda:nccl") is None       # init_process_group() with no backend
    assert _carrier("cuda:nccl") == "cuda"
    assert _carrier("something-new") is None            # tried as CPU tensors; errors named


def test_split_shares_cover_every_byte_once():
    from nvio.checkpoint._dist import split_shares
    import random
    rng = random.Random(3)
    for _ in range(200):
        sizes = [rng.choice([0, 1, 100, 4096, 5000, 1 << 20, rng.randrange(1, 3 << 20)])
                 for _ in range(rng.randrange(1, 30))]
        n = rng.randrange(1, 9)
        shares = split_shares(sizes, n)
        assert len(shares) == n
        seen = [[] for _ in sizes]
        for sh in shares:
            for i, off, k in sh:
                assert k > 0 and off % 4096 == 0
                seen[i].append((off, k))
        for i, s in enumerate(sizes):
            pos = 0
            for off, k in sorted(seen[i]):
                assert off == pos
                pos += k
            assert pos == s
        total = sum(sizes)
        if total > n * (8 << 20):
            per = [sum(k for _, _, k in sh) for sh in shares]
            assert max(per) - min(per) <= 2 * 4096 * max(1, len(sizes))
