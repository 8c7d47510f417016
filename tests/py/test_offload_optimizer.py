"""nvio.offload.NVMeOptimizer: bit-identical to torch's in-memory optimizers,
state_dict round trips, streamed saves with bounded memory, full disks."""
import copy
import errno
import os
import subprocess
import sys

import pytest

import nvio
import nvio_testutil

torch = pytest.importorskip("torch")
from nvio.offload import NVMeOptimizer, SwapError  # noqa: E402

OPTS = {
    "AdamW": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "Adam-amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True, weight_decay=0.01),
    "SGD-momentum": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
}
ENGINES = ("io_uring", "libaio", "psync")
CASES = [(e, "AdamW") for e in ENGINES] + [("libaio", "Adam-amsgrad"), ("psync", "SGD-momentum")]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models on a shared 2-core machine: torch's second thread only spins."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def net(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(50, 32), torch.nn.Linear(32, 96),
                               torch.nn.GELU(), torch.nn.Linear(96, 32),
                               torch.nn.LayerNorm(32)).to(dtype)


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 50, (4, 6), generator=g) for _ in range(n)]


def train(model, opt, xs):
    losses = []
    for x in xs:
        opt.zero_grad()
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def same_params(a, b):
    return nvio_testutil.same(list(a.parameters()), list(b.parameters()))


@pytest.mark.parametrize("engine,name", CASES)
def test_bit_identical_to_torch_50_steps(engine, name, tmp_path):
    if not nvio.engine_available(engine)[0]:
        pytest.skip(engine)
    a = net()
    b = copy.deepcopy(a)
    ref = OPTS[name](a.parameters())
    opt = NVMeOptimizer(OPTS[name](b.parameters()), str(tmp_path), sub_group_numel=3000,
                        engine=engine)
    assert len(opt._subgroups) >= 3
    xs = batches(50)
    for i in range(0, 50, 10):        # compare along the way, not just at the end
        la = train(a, ref, xs[i:i + 10])
        lb = train(b, opt, xs[i:i + 10])
        assert la == lb and same_params(a, b), i
    assert not ref.state or all(len(ref.state[p]) for p in a.parameters())
    assert not opt.optimizer.state               # nothing left in memory between steps
    sd, mine = ref.state_dict(), opt.state_dict()
    assert sd["param_groups"] == mine["param_groups"]
    for i, st in sd["state"].items():
        for k, v in st.items():
            assert torch.equal(v, mine["state"][i][k]) if torch.is_tensor(v) else v == mine["state"][i][k]
    opt.close()


def test_bf16_master_weights(tmp_path):
    """A bf16 model: fp32 masters and fp32 state on NVMe, equal to an in-memory
    mixed-precision loop doing the same arithmetic."""
    a = net(torch.bfloat16)
    b = copy.deepcopy(a)
    masters = [p.detach().float().requires_grad_() for p in a.parameters()]
    ref = torch.optim.AdamW(masters, lr=1e-2)
    opt = NVMeOptimizer(torch.optim.AdamW(b.parameters(), lr=1e-2), str(tmp_path),
                        sub_group_numel=3000)
    assert opt.master_weights
    for x in batches(20):
        for m in (a, b):
            m.zero_grad()
            m(x).float().square().mean().backward()
        for mp, p in zip(masters, a.parameters()):
            mp.grad = p.grad.float()
        ref.step()
        with torch.no_grad():
            for mp, p in zip(masters, a.parameters()):
                p.copy_(mp)
        opt.step()
        assert same_params(a, b)
    sd = opt.state_dict()
    assert all(torch.equal(sd["nvio_master"][i], mp) for i, mp in enumerate(masters))
    assert all(v["exp_avg"].dtype == torch.float32 for v in sd["state"].values())
    opt.close()


def test_state_dict_round_trips(tmp_path):
    a = net()
    ref = torch.optim.AdamW(a.parameters(), lr=1e-2)
    xs = batches(16)
    train(a, ref, xs[:8])
    b = copy.deepcopy(a)
    # torch's state_dict -> NVMe optimizer, then both go on
    opt = NVMeOptimizer(torch.optim.AdamW(b.parameters(), lr=0.5), str(tmp_path / "x"),
                        sub_group_numel=3000) if os.makedirs(tmp_path / "x") is None else None
    opt.load_state_dict(ref.state_dict())
    assert opt.param_groups[0]["lr"] == 1e-2
    train(a, ref, xs[8:12])
    train(b, opt, xs[8:12])
    assert same_params(a, b)
    # streamed save -> a file torch.load and nvio.load read -> a new optimizer
    path = str(tmp_path / "opt.pt")
    opt.save_state(path)
    for sd in (torch.load(path, weights_only=True), nvio.load(path)):
        want = ref.state_dict()
        assert sd["param_groups"] == want["param_groups"]
        for i, st in want["state"].items():
            assert all(torch.equal(v, sd["state"][i][k]) for k, v in st.items())
    c = copy.deepcopy(b)
    opt2 = NVMeOptimizer(torch.optim.AdamW(c.parameters()), str(tmp_path / "x"),
                         sub_group_numel=5000)
    opt2.load_state(path)
    ref2 = torch.optim.AdamW(copy.deepcopy(a).parameters())
    ref2.load_state_dict(opt2.state_dict())      # and back into plain torch
    train(b, opt, xs[12:])
    train(c, opt2, xs[12:])
    train(a, ref, xs[12:])
    assert same_params(a, b) and same_params(a, c)
    with pytest.raises(ValueError, match="parameter groups"):
        opt2.load_state_dict({"state": {}, "param_groups": []})
    opt.close()
    opt2.close()


def test_full_disk_keeps_parameters_and_state_in_step(tmp_path):
    a = net()
    b = copy.deepcopy(a)
    ref = torch.optim.AdamW(a.parameters(), lr=1e-2)
    opt = NVMeOptimizer(torch.optim.AdamW(b.parameters(), lr=1e-2), str(tmp_path),
                        sub_group_numel=3000)
    xs = batches(6)
    train(a, ref, xs[:2])
    train(b, opt, xs[:2])
    # no room for one more sub-group's copy: fill the holes, cap at the end
    sp = opt.swapper._space[0]
    fill = [(sp.alloc(ln), ln) for _, ln in list(sp.holes)]
    sp.limit = sp.end
    used = sum(opt.swapper.bytes_on_disk)
    before = [p.detach().clone() for p in b.parameters()]
    opt.zero_grad()
    b(xs[2]).square().mean().backward()
    with pytest.raises(SwapError) as ei:
        opt.step()
    assert ei.value.errno == errno.ENOSPC and str(tmp_path) in str(ei.value)
    assert "sub-groups" in "".join(getattr(ei.value, "__notes__", []))
    assert all(torch.equal(p, q) for p, q in zip(before, b.parameters()))
    assert sum(opt.swapper.bytes_on_disk) == used
    sp.limit = None                                    # room again: training goes on
    for off, ln in fill:
        sp.free(off, ln)
    opt.step()
    ref.zero_grad()
    a(xs[2]).square().mean().backward()
    ref.step()
    train(a, ref, xs[3:])
    train(b, opt, xs[3:])
    assert same_params(a, b)
    opt.close()


RSS = r"""
import os, sys, torch, nvio
from nvio.offload import NVMeOptimizer
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
def reset():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
d = sys.argv[1]
# a slow disk: writes end 20 ms late, so a step runs ahead of them (on a
# fast one every write may end before the next sub-group, hiding what a
# step holds on to until its writes end)
import time, nvio._futures
_set = nvio._futures.NvioFuture.set_result
def _late(self, r):
    if self.user_data is None:  # an op's future, not the swapper's own
        time.sleep(0.02)
    _set(self, r)
nvio._futures.NvioFuture.set_result = _late
torch.manual_seed(0)
params = [torch.nn.Parameter(torch.randn(1 << 19)) for _ in range(16)]   # 32 MiB fp32
opt = NVMeOptimizer(torch.optim.AdamW(params), d, sub_group_numel=1 << 19)
for p in params:
    p.grad = torch.randn_like(p)
opt.step()
state = 2 * 8 * 4 << 20                                                    # 64 MiB of moments
out = {"pool": opt.swapper.pool_bytes, "state": state}
opt.step()                 # the allocator's caches and nvio's staging are made by now
reset(); base = rss(); opt.step(); out["step"] = hwm() - base
opt.save_state(os.path.join(d, "o.pt"))
reset(); base = rss(); opt.save_state(os.path.join(d, "o.pt")); out["save_state"] = hwm() - base
reset(); base = rss(); sd = opt.state_dict(); nvio.save(sd, os.path.join(d, "p.pt"))
out["state_dict+save"] = hwm() - base
del sd
ok = all(torch.equal(a, b) for a, b in zip(
    torch.load(os.path.join(d, "o.pt"))["state"][3].values(),
    torch.load(os.path.join(d, "p.pt"))["state"][3].values()))
out["same"] = ok
print(out)
"""


def test_memory_is_bounded_by_the_pool(tmp_path):
    """Peak RSS of a step and of save_state grows by the pool (3 sub-groups of
    state) and the step's own temporaries, not by the 64 MiB of state; the
    in-memory state_dict + nvio.save path grows by the whole state. Measured
    in steady state: the first calls also make malloc's caches and nvio's
    staging buffers (bounded by nvio's staging limit, not by the state)."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("no /proc/self/clear_refs")
    r = subprocess.run([sys.executable, "-c", RSS, str(tmp_path)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = eval(r.stdout.strip().splitlines()[-1])
    assert out["same"]
    assert out["pool"] < out["state"] / 3
    assert out["save_state"] < 16 << 20, out          # regions are in the pool
    assert out["step"] < 24 << 20, out                # not the 32 MiB of parameters
    assert out["state_dict+save"] > out["state"] * 0.9, out


def test_safe_steps_copies_reuse_their_buffers(engine, tmp_path):
    """safe_steps' copy of each sub-group's parameters goes to buffers made
    once and reused (a fresh allocation per sub-group cost a page fault per
    4 KiB, more than a fused AdamW update of it): over 12 steps of 5
    sub-groups (60 copies) no more are made than there are sub-groups (the
    most one step can have in flight; a step ends with none), however
    slow the disk; results stay bit-identical, and a failed write still
    restores from a reused buffer."""
    a = net()
    b = copy.deepcopy(a)
    ref = torch.optim.AdamW(a.parameters(), lr=1e-2)
    opt = NVMeOptimizer(torch.optim.AdamW(b.parameters(), lr=1e-2), str(tmp_path),
                        sub_group_numel=1200, engine=engine)
    assert len(opt._subgroups) >= 5
    xs = batches(12)
    assert train(a, ref, xs) == train(b, opt, xs)
    assert same_params(a, b)
    assert 1 <= opt._snaps.made <= len(opt._subgroups), opt._snaps.made
    assert opt._snaps.out == 0
    made = opt._snaps.made
    sp = opt.swapper._space[0]
    fill = [(sp.alloc(ln), ln) for _, ln in list(sp.holes)]
    sp.limit = sp.end
    before = [p.detach().clone() for p in b.parameters()]
    opt.zero_grad()
    b(xs[0]).square().mean().backward()
    with pytest.raises(SwapError):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(before, b.parameters()))
    assert opt._snaps.made == made and opt._snaps.out == 0
    sp.limit = None
    for off, ln in fill:
        sp.free(off, ln)
    opt.close()
