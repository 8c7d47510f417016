"""Checkpoint saves under failing system calls and SIGKILL.

Faults: an LD_PRELOAD shim (faultlib/fault_preload.c, built here with cc)
fails the n-th call of each libc function libnvio uses to write a file
(open, fallocate, pwrite, pwritev, ftruncate, fsync, linkat, rename) with
EIO or ENOSPC, or makes the n-th pwrite/pwritev move half its bytes, for
every n a save makes (sampled when there are many). Every time: the error
is an OSError naming the file, the destination holds its old checkpoint (or,
where the call that failed came after the rename, the new one and an error
about the directory), and no temporary is left. Short transfers are finished
by libnvio: the save succeeds with the right bytes.

Kill: a forked child saves in a loop and is killed with SIGKILL at random
moments, 200 times; every time the destination loads and equals the last
state the child finished or the one it was writing, and at most the killed
child's temporary is left beside it (the next save removes it: its owner
is dead). Again 40 times where O_TMPFILE is refused (named temporaries from
the start, as on NFS).
"""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import nvio

torch = pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
ENGINES = ("io_uring", "libaio", "psync")




FAULT_SCRIPT = r"""
import ctypes, errno, json, os, random, sys
import torch, nvio
lib = ctypes.CDLL(None)
lib.nvio_fault_arm.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_int, ctypes.c_char_p]
lib.nvio_fault_count.restype = ctypes.c_long
d, engine, direct = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
p = os.path.join(d, "ck.pt")
g = torch.Generator().manual_seed(5)
old = {"old": torch.arange(1000)}
new = {"w": torch.randn((1 << 20) + 7, generator=g), "b": torch.randn(4099, generator=g),
       "small": [torch.full((n,), float(n)) for n in (1, 100, 1025)], "step": 3}
h = nvio.AioHandle(engine=engine, direct=direct, block_size=256 << 10,
                   intra_op_parallelism=2)
def restore():
    global before
    nvio.save(old, p, handle=h)
    before = open(p, "rb").read()

restore()
names = ["open", "fallocate", "pwrite", "pwritev", "ftruncate", "fsync", "linkat", "rename"]
rng = random.Random(1)
out = []

def same_new(sd):
    return (torch.equal(sd["w"], new["w"]) and torch.equal(sd["b"], new["b"]) and
            all(torch.equal(a, b) for a, b in zip(sd["small"], new["small"])) and sd["step"] == 3)

for name in names:
    lib.nvio_fault_arm(name.encode(), 0, 0, d.encode())
    nvio.save(new, p, handle=h)
    count = lib.nvio_fault_count()
    lib.nvio_fault_arm(b"", 0, 0, None)
    restore()
    ks = list(range(1, count + 1))
    if len(ks) > 10:
        ks = sorted(rng.sample(ks, 10))
    errs = [errno.EIO, errno.ENOSPC] + ([-1] if name in ("pwrite", "pwritev") else [])
    for k in ks:
        for e in errs:
            lib.nvio_fault_arm(name.encode(), k, e, d.encode())
            err = None
            try:
                nvio.save(new, p, handle=h)
            except OSError as x:
                err = x
            fired = lib.nvio_fault_fired()
            oflags = lib.nvio_fault_fired_flags()
            lib.nvio_fault_arm(b"", 0, 0, None)
            left = sorted(os.listdir(d))
            data = open(p, "rb").read()
            state = "old" if data == before else "new" if same_new(nvio.load(p)) else "BAD"
            out.append({"call": name, "nth": k, "err": e, "fired": fired, "oflags": oflags,
                        "raised": None if err is None else err.errno,
                        "msg": "" if err is None else str(err),
                        "named": err is None or p in str(err) or getattr(err, "filename", None) == p,
                        "state": state, "left": left})
            if state != "old":
                restore()
print(json.dumps(out))
"""


@pytest.mark.parametrize("engine,direct", [(e, True) for e in ENGINES] + [("psync", False)])
def test_faults_at_every_call_of_a_save(preload, tmp_path, engine, direct):
    ok, why = nvio.engine_available(engine)
    if not ok:
        pytest.skip(why)
    d = tmp_path / "d"
    d.mkdir()
    env = dict(os.environ, LD_PRELOAD=preload)
    r = subprocess.run([sys.executable, "-c", FAULT_SCRIPT, str(d), engine,
                        "1" if direct else "0"], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    cases = json.loads(r.stdout.strip().splitlines()[-1])
    fired = [c for c in cases if c["fired"]]
    calls = {c["call"] for c in fired}
    # the calls every save makes were reached
    assert {"fsync", "rename"} <= calls, calls
    if engine == "psync":                 # the others move data without libc calls
        assert calls & {"pwrite", "pwritev"}, calls
    for c in cases:
        assert c["left"] == ["ck.pt"], c              # no temporary left
        assert c["state"] != "BAD", c
        if not c["fired"]:
            assert c["raised"] is None and c["state"] == "new", c
        elif (c["call"] == "open" and c["raised"] is None and
              c["oflags"] & os.O_DIRECTORY and not c["oflags"] & os.O_ACCMODE):
            # the sweep of dead writers' temporaries is best effort: a
            # directory it cannot read does not fail the save
            assert c["state"] == "new", c
        elif c["err"] == -1:                          # short transfer: finished
            assert c["raised"] is None and c["state"] == "new", c
        else:
            assert c["raised"] is not None, c         # never a silent success
            assert c["named"], c
            if c["state"] == "new":                   # only after the rename
                assert "director" in c["msg"], c
            else:
                assert c["raised"] in (c["err"], 5), c


KILL_ROUNDS = 200
KILL_ROUNDS_NAMED = 40


def make_state(i):
    return {"i": i, "w": torch.full((300_000 + i,), float(i)),
            "v": torch.arange(5000, dtype=torch.int64) * i,
            "small": [torch.full((k,), float(i + k)) for k in (1, 3, 4097)]}


def check_state(sd):
    i = sd["i"]
    ref = make_state(i)
    assert torch.equal(sd["w"], ref["w"]) and torch.equal(sd["v"], ref["v"])
    assert all(torch.equal(a, b) for a, b in zip(sd["small"], ref["small"]))
    return i


def _child(p, start, wfd):
    torch.set_num_threads(1)      # no OpenMP in a forked child
    i = start
    while True:
        _save(make_state(i), p, i)
        os.write(wfd, b".")
        i += 1


def _save(st, p, i):
    """Save i: sync or async, durable (fsync) or not, in turn."""
    durable = i % 4 < 2
    if i % 2:
        nvio.async_save(st, p, durable=durable).result()
    else:
        nvio.save(st, p, durable=durable)


def kill_rounds(d, rounds, seed):
    """Saves in a forked child, SIGKILLed at a random moment, ``rounds``
    times; checks the directory after each. Returns (landed, stale): the
    rounds in which the checkpoint changed, and the temporaries seen."""
    p = os.path.join(d, "ck.pt")
    nvio.save(make_state(0), p)
    # how long a forked child takes to finish its first save here and now
    # (it makes its own handle and async pool first: a save timed in this
    # process is far quicker): the kills spread over ~2 of those
    took = []
    for k in range(5):
        rfd, wfd = os.pipe()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(rfd)
                _child(p, 0, wfd)
            finally:
                os._exit(1)
        os.close(wfd)
        os.read(rfd, 1)
        took.append(time.monotonic() - t0)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(rfd)
    span = 2 * sorted(took)[2]
    nvio.save(make_state(0), p)
    last = 0
    rng = random.Random(seed)
    landed = stale = 0
    for rnd in range(rounds):
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(rfd)
                _child(p, last + 1, wfd)
            finally:
                os._exit(1)
        os.close(wfd)
        time.sleep(rng.uniform(0, span))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status), "round %d: the child ended by itself" % rnd
        done = 0
        while True:
            b = os.read(rfd, 4096)
            if not b:
                break
            done += len(b)
        os.close(rfd)
        got = check_state(nvio.load(p))
        # the last save the child finished, or the one it was in
        assert got in (last + done, last + done + 1), (rnd, last, done, got)
        landed += got != last
        last = got
        # A temporary is named just before its rename (O_TMPFILE: Linux has
        # no link-over) or from the start (no O_TMPFILE): a kill leaves it,
        # and the next save into the directory removes it (its owner is
        # dead). So at most the one of the killed child is there.
        left = sorted(os.listdir(d))
        assert "ck.pt" in left and len(left) <= 2, (rnd, left)
        assert all(n == "ck.pt" or n.startswith(".ck.pt.nvio-") for n in left), (rnd, left)
        stale += len(left) - 1
    nvio.save(make_state(0), p)
    assert os.listdir(d) == ["ck.pt"]
    return landed, stale


def test_sigkill_during_saves_leaves_old_or_new(tmp_path):
    d = tmp_path / "k"
    d.mkdir()
    landed, stale = kill_rounds(str(d), KILL_ROUNDS, 7)
    assert landed > KILL_ROUNDS // 4       # the kills landed at varied moments


NAMED_SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[1])
import test_checkpoint_faults as t
landed, stale = t.kill_rounds(sys.argv[2], int(sys.argv[3]), 11)
print(landed, stale)
"""


def test_sigkill_with_named_temporaries(preload, tmp_path):
    """Where there is no O_TMPFILE the data goes into a named temporary from
    the start: nearly every kill leaves one, full size, and the next save
    removes it."""
    d = tmp_path / "k"
    d.mkdir()
    env = dict(os.environ, LD_PRELOAD=preload, NVIO_FAULT_NO_TMPFILE="1")
    r = subprocess.run([sys.executable, "-c", NAMED_SCRIPT, HERE, str(d),
                        str(KILL_ROUNDS_NAMED)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    landed, stale = map(int, r.stdout.split()[-2:])
    assert landed > KILL_ROUNDS_NAMED // 4
    assert stale > KILL_ROUNDS_NAMED // 4   # named temporaries were left, and swept


SIGINT_SCRIPT = r"""
import sys, torch, nvio
p = sys.argv[1]
big = {"w": torch.full((64 << 20,), 2.0), "i": 2}
try:
    while True:
        print("saving", flush=True)
        (nvio.async_save(big, p).result() if sys.argv[2] == "async" else nvio.save(big, p))
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_ctrl_c_during_save(tmp_path, kind):
    d = tmp_path / "c"
    d.mkdir()
    p = d / "ck.pt"
    nvio.save({"w": torch.full((10,), 1.0), "i": 1}, p)
    proc = subprocess.Popen([sys.executable, "-c", SIGINT_SCRIPT, str(p), kind],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "saving"
        time.sleep(0.3 + random.random() * 0.5)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert "interrupted" in out and proc.returncode == 0
    sd = nvio.load(p)
    assert sd["i"] in (1, 2)
    assert torch.equal(sd["w"], torch.full(sd["w"].shape, float(sd["i"])))
    assert os.listdir(d) == ["ck.pt"]
