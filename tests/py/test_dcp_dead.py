"""A rank killed inside torch.distributed.checkpoint's own collectives (while
DCP gathers or scatters plans, write results or metadata) during
nvio.dcp.save or nvio.dcp.load: every surviving rank's error names it by
number ("Rank N died"), from the heartbeats in the process group's store,
within the group's timeout; the previous checkpoint still loads.

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
import nvio.dcp as nd

rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
d, kind, where = sys.argv[4], sys.argv[5], sys.argv[6]
victim, timeout = int(sys.argv[7]), int(sys.argv[8])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                        world_size=world, timeout=datetime.timedelta(seconds=timeout))

def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 1000, generator=g), "b": torch.randn(4097, generator=g),
            "h": torch.randn(77, generator=g).bfloat16()}

def die(*a, **k):
    os._exit(3)

def arm():
    '''The victim's hook: the storage method ``where`` ends its process
    (before it runs; "after_" + name: once it has run).'''
    if rank != victim:
        return
    cls = nd.FileSystemWriter if kind == "save" else nd.FileSystemReader
    after = where.startswith("after_")
    name = where[len("after_"):] if after else where
    real = getattr(cls, name)
    def hook(self, *a, **k):
        if after:
            real(self, *a, **k)
        die()
    setattr(cls, name, hook)

out = {"rank": rank}
t0 = None
try:
    nd.save(state(1), checkpoint_id=d)
    dist.barrier()
    arm()
    t0 = time.monotonic()
    if kind == "save":
        nd.save(state(2), checkpoint_id=d)
    else:
        sd = {k: torch.zeros_like(v) for k, v in state(1).items()}
        nd.load(sd, checkpoint_id=d)
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


def run(tmp_path, kind, where, world, victim):
    d = tmp_path / "ck"
    res, outs = nvio_testutil.run_ranks(RANK_SCRIPT, world,
                                        [d, kind, where, victim, TIMEOUT],
                                        TIMEOUT * 3, dict(os.environ, OMP_NUM_THREADS="1"))
    assert victim not in res, outs                 # it died
    survivors = [r for r in range(world) if r != victim]
    assert sorted(res) == survivors, outs
    for r in survivors:
        got = res[r]
        assert got["rc"] == 0 and not got["ok"], got
        # named by number, as dead, by every survivor, in nvio's error
        assert re.search(r"\bRank %d died\b" % victim, got["error"]), got
        assert got["error"].startswith("CheckpointError: nvio.dcp: %s" % d), got
        assert got["secs"] < TIMEOUT, got               # within the group's timeout
    print("%s %s world %d victim %d: %s" % (kind, where, world, victim,
                                            ["%.1f s" % res[r]["secs"] for r in survivors]))
    return d, res


def load_back(d):
    """The checkpoint in d, read on one process (no group)."""
    import warnings
    import nvio.dcp as nd
    sd = {k: torch.zeros_like(v) for k, v in state(1).items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)     # DCP: "assuming ... a single process"
        nd.load(sd, checkpoint_id=d, no_dist=True)
    return sd


SAVE_CASES = [
    ("prepare_local_plan", 2, 1),       # the others gather the local plans
    ("prepare_local_plan", 3, 2),
    ("prepare_global_plan", 3, 0),      # the coordinator (the store's host), plans unsent
    ("after_write_data", 2, 1),         # past nvio's barrier: DCP gathers the results
    ("after_write_data", 3, 1),
]


@pytest.mark.parametrize("where,world,victim", SAVE_CASES)
def test_dcp_save_names_a_rank_dead_in_dcps_collectives(tmp_path, where, world, victim):
    d, res = run(tmp_path, "save", where, world, victim)
    for r in res.values():
        assert "previous checkpoint" in r["error"], r
    same(load_back(d), state(1))                # the old checkpoint, whole


@pytest.mark.parametrize("where,world,victim", [("prepare_local_plan", 2, 1),
                                                ("read_metadata", 3, 0),
                                                ("after_read_data", 3, 1)])
def test_dcp_load_names_a_rank_dead_in_dcps_collectives(tmp_path, where, world, victim):
    d, res = run(tmp_path, "load", where, world, victim)
    same(load_back(d), state(1))
