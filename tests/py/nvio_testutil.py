"""Small helpers shared by the nvio Python tests."""


def pattern(n, seed=0):
    """n bytes that differ at every offset (so misplaced bytes show up)."""
    import random
    return random.Random(seed * 1000003 + n).randbytes(n)


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def free_port():
    """A TCP port free on 127.0.0.1 now (for a process group's store)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script, world, args, timeout, env=None):
    """Run ``python -c script RANK WORLD PORT *args`` once per rank: fresh
    interpreters that meet on a loopback port, each printing one JSON line
    (a dict with "rank") last. Ranks still running after ``timeout``
    seconds are killed. ``env``: the environment, or a function of the
    rank giving it (default: this one's, OMP_NUM_THREADS=1).

    Returns ({rank: its JSON dict plus "rc" and "stderr" (the tail)},
    [(returncode, stdout, stderr) per rank]) for assertions to print."""
    import json
    import os
    import subprocess
    import sys
    import time
    port = free_port()
    base = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), str(world), str(port)] +
                              [str(a) for a in args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=env(r) if callable(env) else env or base)
             for r in range(world)]
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=max(1, deadline - time.monotonic()))
            outs.append((p.returncode, o, e[-6000:]))
    finally:
        for p in procs:
            p.kill()
    res = {}
    for rc, o, e in outs:
        lines = [x for x in o.splitlines() if x.startswith("{")]
        if lines:
            r = json.loads(lines[-1])
            r["rc"] = rc
            r["stderr"] = e
            res[r["rank"]] = r
    return res, outs
