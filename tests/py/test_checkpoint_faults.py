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

Kill: a forked child saves in a loop, reporting each save's start and end
through a pipe, and is killed with SIGKILL at a random moment of its third
save, spread over the duration of its second as the parent saw it (so the
kills follow the child's own pace, whatever else loads the machine), 200
times; every time the destination loads and equals the last state the
child finished or the one it was writing, and at most the killed child's
temporary is left beside it (the next save or `nvio clean` removes it: its
owner is dead). Again 40 times where O_TMPFILE is refused (named
temporaries from the start, as on NFS). Rounds go on (up to twice as many)
until enough kills came inside a save, before its rename and, named, while
its temporary was there. The same kills catch a writer that is not atomic
(torch.save in place) leaving a broken file.
"""
import json
import os
import random
import select
import signal
import subprocess
import sys
import time

import pytest

import nvio
from nvio import _nvio

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
NVIO = os.path.join(HERE, "..", "..", "build", "nvio")


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


def _save(st, p, kind):
    """Save kind 0-3: durable (fsync) or not, sync or async."""
    durable = kind < 2
    if kind % 2:
        nvio.async_save(st, p, durable=durable).result()
    else:
        nvio.save(st, p, durable=durable)


def _save_spare(st, p, kind):
    """As _save, with spare=True: the new version goes into the blocks of
    the one before the last, swapped in at commit."""
    durable = kind < 2
    if kind % 2:
        nvio.async_save(st, p, durable=durable, spare=True).result()
    else:
        nvio.save(st, p, durable=durable, spare=True)


def _save_in_place(st, p, kind):
    """A writer that is not atomic (torch.save truncates and writes in
    place): the kills must catch it."""
    torch.save(st, p)


def _child(p, start, kind, wfd, save):
    """Saves states start, start + 1, ... reporting b"s" as each save
    begins and b"d" when it has returned."""
    torch.set_num_threads(1)      # no OpenMP in a forked child
    i = start
    while True:
        st = make_state(i)
        os.write(wfd, b"s")
        save(st, p, kind)
        os.write(wfd, b"d")
        i += 1


def _reports(rfd, got, want=None, until=None, timeout=120.0):
    """Appends the child's reports to got as (byte, time read), until it
    holds ``want`` of them or the monotonic clock reaches ``until``. False
    if the child ended or made no progress within ``timeout`` seconds."""
    limit = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        if (want is not None and len(got) >= want) or (until is not None and now >= until):
            return True
        if now >= limit:
            return False
        end = limit if until is None else min(until, limit)
        if select.select([rfd], [], [], max(0.0, end - now))[0]:
            b = os.read(rfd, 4096)
            if not b:
                return False
            t = time.monotonic()
            got.extend((c, t) for c in b)


def _kill_round(p, first, kind, rng, save):
    """One child: saves ``first`` and ``first + 1`` complete (the second
    timed by the child's own reports: how long one save takes here and
    now, whatever else the machine is doing), then SIGKILL at a random
    moment of the next save, spread over 1.25 times that duration. Returns
    (pid, saves it reported done, whether the kill came inside a save)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(rfd)
            _child(p, first, kind, wfd, save)
        finally:
            os._exit(1)
    os.close(wfd)
    try:
        got = []
        ok = _reports(rfd, got, want=5)                 # s d s d s
        if ok:
            took = got[3][1] - got[2][1]
            ok = _reports(rfd, got, until=got[4][1] + rng.uniform(0, 1.25) * took)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert ok, "the child's saves reported only %r in 120 s" % bytes(c for c, _ in got)
        assert os.WIFSIGNALED(status), "the child ended by itself"
        while True:
            b = os.read(rfd, 4096)
            if not b:
                break
            got.extend((c, 0) for c in b)
    finally:
        os.close(rfd)
    seen = bytes(c for c, _ in got)
    return pid, seen.count(b"d"), seen.endswith(b"s")


SPARE = ".ck.pt.nvio-spare"


def kill_rounds(d, rounds, seed, named=False, save=_save, spare=False):
    """Saves in forked children, each SIGKILLed at a random moment of a
    save (kinds 0-3 in turn), at least ``rounds`` times and until enough
    kills came inside a save (and, ``named``, left a named temporary),
    within twice ``rounds``. After EVERY kill the destination loads and
    equals the last state the child finished or the one it was in; at
    most the killed child's temporary is beside it, removed by `nvio
    clean` (every other round) or by the next save (the others).
    Returns counts: rounds, inside (killed inside a save), kept (of those,
    the destination held the state before), landed (the save killed had
    already renamed its file), stale (temporaries left). ``spare``: the
    saves keep a spare (save=_save_spare), which is not a temporary: it
    stays beside the destination through kills and `nvio clean`."""
    p = os.path.join(d, "ck.pt")
    nvio.save(make_state(0), p)
    rng = random.Random(seed)
    n = dict(rounds=0, inside=0, kept=0, landed=0, stale=0)
    last = 0

    def enough():
        return (n["inside"] >= rounds // 2 and n["kept"] >= rounds // 4 and
                (not named or n["stale"] >= rounds // 4))

    for rnd in range(2 * rounds):
        if rnd >= rounds and enough():
            break
        pid, done, inside = _kill_round(p, last + 1, rnd % 4, rng, save)
        try:
            got = check_state(nvio.load(p))
        except Exception as e:          # noqa: BLE001 - any unreadable file
            raise AssertionError("round %d: a kill inside a save left %s unreadable "
                                 "(%s: %s)" % (rnd, p, type(e).__name__, e)) from None
        # the last save the child finished, or the one it was in
        assert got in (last + done, last + done + 1), (rnd, last, done, got)
        n["rounds"] += 1
        n["inside"] += inside
        n["kept"] += inside and got == last + done
        n["landed"] += got == last + done + 1
        last = got
        # A temporary is named just before its rename (O_TMPFILE: Linux has
        # no link-over) or from the start (no O_TMPFILE): a kill leaves it.
        # At most the killed child's is there: the one before was removed.
        left = sorted(x for x in os.listdir(d) if not (spare and x == SPARE))
        temps = [x for x in left if x != "ck.pt"]
        assert "ck.pt" in left and len(temps) <= 1, (rnd, left)
        assert all(x.startswith(".ck.pt.nvio-") and x.split("-")[2] == str(pid)
                   for x in temps), (rnd, pid, left)
        n["stale"] += len(temps)
        if temps and rnd % 2:
            _clean(d)
            assert sorted(os.listdir(d)) == _kept(spare, d), (rnd, os.listdir(d))
    _clean(d)
    assert sorted(os.listdir(d)) == _kept(spare, d) and check_state(nvio.load(p)) == last
    return n


def _kept(spare, d):
    """What a directory of kill rounds holds once cleaned: the destination,
    and its spare (which every save after the second leaves)."""
    return [SPARE, "ck.pt"] if spare and os.path.exists(os.path.join(d, SPARE)) else ["ck.pt"]


def _clean(d):
    """`nvio clean d` (the tool where it is built, else the same C call
    through the binding)."""
    if os.access(NVIO, os.X_OK):
        r = subprocess.run([NVIO, "clean", d], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    else:
        _nvio.clean_temporaries(d)


def test_sigkill_during_saves_leaves_old_or_new(tmp_path):
    d = tmp_path / "k"
    d.mkdir()
    n = kill_rounds(str(d), KILL_ROUNDS, 7)
    # the kills came inside saves, many before the new file was in place
    assert n["inside"] >= KILL_ROUNDS // 2 and n["kept"] >= KILL_ROUNDS // 4, n


def test_sigkill_catches_a_writer_that_is_not_atomic(tmp_path):
    """The kills land while bytes are written: a writer that truncates and
    writes in place (torch.save) is caught leaving a broken file within a
    few rounds (else the test above could not fail)."""
    d = tmp_path / "k"
    d.mkdir()
    with pytest.raises(AssertionError, match="unreadable"):
        kill_rounds(str(d), 20, 3, save=_save_in_place)


KILL_ROUNDS_SPARE = 40


def test_sigkill_during_spare_saves_leaves_old_or_new(tmp_path):
    """spare=True: the data goes into the spare's blocks and only an
    exchange of names puts it in place; a kill at any moment leaves the old
    or the new checkpoint, and the spare stays (40 rounds)."""
    d = tmp_path / "k"
    d.mkdir()
    n = kill_rounds(str(d), KILL_ROUNDS_SPARE, 13, save=_save_spare, spare=True)
    assert n["inside"] >= KILL_ROUNDS_SPARE // 2 and n["kept"] >= KILL_ROUNDS_SPARE // 4, n
    assert os.path.exists(os.path.join(str(d), SPARE))     # the spare was in use


NAMED_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import test_checkpoint_faults as t
print(json.dumps(t.kill_rounds(sys.argv[2], int(sys.argv[3]), 11, named=True)))
"""


def test_sigkill_with_named_temporaries(preload, tmp_path):
    """Where there is no O_TMPFILE the data goes into a named temporary from
    the start: nearly every kill leaves one, full size, and the next save
    or `nvio clean` removes it."""
    d = tmp_path / "k"
    d.mkdir()
    env = dict(os.environ, LD_PRELOAD=preload, NVIO_FAULT_NO_TMPFILE="1")
    r = subprocess.run([sys.executable, "-c", NAMED_SCRIPT, HERE, str(d),
                        str(KILL_ROUNDS_NAMED)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    n = json.loads(r.stdout.strip().splitlines()[-1])
    assert n["inside"] >= KILL_ROUNDS_NAMED // 2, n
    assert n["stale"] >= KILL_ROUNDS_NAMED // 4, n   # named temporaries were left, and removed


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
