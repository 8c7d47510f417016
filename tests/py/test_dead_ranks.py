"""A rank killed at any moment of a group save, load or parallel
FastFileWriter: every surviving rank's error names it by number, from the
process group's store (heartbeats and counts of who came to each step), not
from the transport's wording; within the group's timeout; and the old file
is left as it was (or, killed after rank 0 committed, the new one whole).

Each case starts 2 or 3 rank processes (gloo on loopback, a 30 s group
timeout); the victim's hook ends its process with os._exit at one point.
"""
import os
import re

import pytest

import nvio_testutil
from nvio_testutil import same

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

TIMEOUT = 30

RANK_SCRIPT = r"""
import datetime, json, os, sys, time
import torch, torch.distributed as dist
import nvio
from nvio.checkpoint import _dist

rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
d, kind, where = sys.argv[4], sys.argv[5], sys.argv[6]
victim, timeout = int(sys.argv[7]), int(sys.argv[8])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                        world_size=world, timeout=datetime.timedelta(seconds=timeout))
path = os.path.join(d, "ck.pt")
G = dist.group.WORLD

def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(300, 1000, generator=g), "b": torch.randn(4097, generator=g),
            "h": torch.randn(77, generator=g).bfloat16(), "step": seed}

def die(*a, **k):
    os._exit(3)

def arm():
    '''The victim's hook: "arrive:STEP" dies before counting in for STEP,
    "run:STEP" after counting in, before STEP's collective; "crc" while
    writing its share (the file open, its pieces prepared); "bcast" in a
    load's broadcast; "put" in a FastFileWriter's first write.'''
    if rank != victim:
        return
    how, _, step = where.partition(":")
    if how in ("arrive", "run"):
        real = getattr(_dist._Group, how)
        def hook(self, what, *a, **k):
            if what == step:
                die()
            return real(self, what, *a, **k)
        setattr(_dist._Group, how, hook)
    elif how == "crc":
        _dist.crc_submit = die
    elif how == "bcast":
        dist.broadcast = die
    elif how == "put":
        from nvio import _filewriters
        _filewriters.FastFileWriter._put = die

out = {"rank": rank}
t0 = None
try:
    if kind == "save":
        arm()
        t0 = time.monotonic()
        nvio.save(state(2), path, group=G)
    elif kind == "load":
        nvio.save(state(1), path, group=G)
        dist.barrier()
        arm()
        t0 = time.monotonic()
        nvio.load(path, group=G, share=True)
    elif kind == "late":                # alive, but later than the timeout given
        nvio.save(state(1), path, group=G)
        if rank == victim:
            time.sleep(10)
        t0 = time.monotonic()
        nvio.save(state(2), path, group=G, timeout=3)
    elif kind == "writer":
        from nvio.compat import FastFileWriter, FastFileWriterConfig
        cfg = FastFileWriterConfig(pinned_tensor=torch.zeros(1 << 16, dtype=torch.uint8),
                                   num_parallel_writers=world, writer_rank=rank,
                                   stripe_bytes=8192, group=G)
        arm()
        t0 = time.monotonic()
        with FastFileWriter(path, cfg) as w:
            torch.save(state(2), w)
    out["ok"] = True
except Exception as e:
    out["ok"] = False
    out["error"] = "%s: %s" % (type(e).__name__, e)
out["secs"] = time.monotonic() - t0 if t0 is not None else None
print(json.dumps(out), flush=True)
os._exit(0)      # no teardown collective with a rank that is gone
"""

STATE = RANK_SCRIPT[RANK_SCRIPT.index("def state"):RANK_SCRIPT.index("def die")]


def state(seed):
    ns = {"torch": torch}
    exec(STATE, ns)
    return ns["state"](seed)


def run(tmp_path, kind, where, world=2, victim=1):
    p = tmp_path / "ck.pt"
    old = {"old": torch.arange(10)}
    torch.save(old, p)
    before = p.read_bytes()
    res, outs = nvio_testutil.run_ranks(RANK_SCRIPT, world,
                                        [tmp_path, kind, where, victim, TIMEOUT],
                                        TIMEOUT * 3, dict(os.environ, OMP_NUM_THREADS="1"))
    assert victim not in res, outs                 # it died
    survivors = [r for r in range(world) if r != victim]
    assert sorted(res) == survivors, outs
    for r in survivors:
        got = res[r]
        assert got["rc"] == 0 and not got["ok"], got
        # named by number, as dead, by every survivor
        assert re.search(r"\bRank %d died\b" % victim, got["error"]), got
        assert got["secs"] < TIMEOUT, got               # within the group's timeout
    return p, before, res


SAVE_CASES = [
    ("arrive:laying out the checkpoint", 2, 1),      # before the first step's barrier
    ("run:laying out the checkpoint", 2, 1),         # between its barrier and its gather
    ("crc", 3, 1),                                   # writing its share, one of three
    ("arrive:writing the shares", 3, 2),             # before the commit: its share unreported
    ("run:writing the shares", 2, 1),                # ... counted in, before the gather
    ("crc", 2, 0),                                   # rank 0, the store's host, writing
]


@pytest.mark.parametrize("where,world,victim", SAVE_CASES)
def test_a_save_names_the_dead_rank_and_keeps_the_old_file(tmp_path, where, world, victim):
    p, before, res = run(tmp_path, "save", where, world, victim)
    for r in res.values():
        assert "CheckpointError" in r["error"] and str(p) in r["error"], r
        assert "previous checkpoint (if any) is unchanged" in r["error"], r
    assert p.read_bytes() == before
    if victim != 0:                 # rank 0 removed its temporary
        assert os.listdir(tmp_path) == ["ck.pt"]


def test_a_rank_dying_after_the_commit_is_named_and_the_new_file_is_whole(tmp_path):
    """Rank 1 dies before the last step, after rank 0 committed: the new
    checkpoint is in place (whole), and both errors say so."""
    p, before, res = run(tmp_path, "save", "arrive:committing", 2, 1)
    assert "the new checkpoint was committed" in res[0]["error"], res
    same(torch.load(p, weights_only=True), state(2))
    assert os.listdir(tmp_path) == ["ck.pt"]


@pytest.mark.parametrize("where,world", [("arrive:load: reading the shares", 2),
                                         ("run:load: reading the pickle", 3),
                                         ("bcast", 3)])
def test_a_load_names_the_dead_rank(tmp_path, where, world):
    p, _, res = run(tmp_path, "load", where, world, 1)
    for r in res.values():
        assert "nvio.load" in r["error"] and str(p) in r["error"], r
    same(torch.load(p, weights_only=True), state(1))     # the file the load read


@pytest.mark.parametrize("where", ["put", "run:writing the stripes"])
def test_parallel_writers_name_the_dead_writer(tmp_path, where):
    p, before, res = run(tmp_path, "writer", where, 2, 1)
    assert "FastFileWriter" in res[0]["error"] and str(p) in res[0]["error"], res
    assert p.read_bytes() == before
    assert os.listdir(tmp_path) == ["ck.pt"]


def test_a_late_rank_is_named_as_late_at_the_timeout(tmp_path):
    """A rank alive (its heartbeat runs) but not there when the timeout given
    to the save runs out: named as late, not dead, after that timeout."""
    res, outs = nvio_testutil.run_ranks(RANK_SCRIPT, 2, [tmp_path, "late", "-", 1, TIMEOUT],
                                        TIMEOUT * 3, dict(os.environ, OMP_NUM_THREADS="1"))
    r = res.get(0)
    assert r is not None and not r["ok"], outs
    assert "Rank 1 did not reach laying out the checkpoint within the group's timeout of 3 s" \
        " (alive: its heartbeat runs)" in r["error"], r
    assert 3 <= r["secs"] < 10, r
    same(torch.load(tmp_path / "ck.pt", weights_only=True), state(1))
