"""Small helpers shared by the nvio Python tests."""
import contextlib


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


_ports = []


def free_port():
    """A TCP port free on 127.0.0.1 now (for a process group's store).

    Taken below the kernel's ephemeral range (where every connection of
    the ranks, gloo's included, gets its local port, so none can take it
    between this check and the store's bind), from a band of its own per
    pytest-xdist worker (PYTEST_XDIST_WORKER gwN), so that tests running
    at once in two workers never pick the same port; ports handed out
    before are skipped. Falls back to a port the kernel picks."""
    import os
    import socket
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    band = 1000
    start = 10000 + (n % 16) * band
    if start + band <= low:
        for i in range(band):
            port = start + (os.getpid() + len(_ports) + i) % band
            if port in _ports:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))   # no SO_REUSEADDR: TIME_WAIT counts as taken
                except OSError:
                    continue
            _ports.append(port)
            return port
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


# --- comparing tensors and state dicts -------------------------------------------


def byte_view(t):
    """A tensor's elements' bytes, in row-major order, as a flat uint8
    tensor (a view where ``t`` is contiguous; a copy otherwise). The bits
    themselves: NaN payloads, -0.0, float8 and bool are compared as stored.
    Quantized tensors give their integer representation; a meta tensor,
    which has no bytes, gives None."""
    import torch
    if t.is_meta:
        return None
    t = t.detach()
    if t.is_quantized:
        t = t.int_repr()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.contiguous().reshape(-1).view(torch.uint8)


def storage_bytes(s):
    """An UntypedStorage (or TypedStorage)'s bytes as a flat uint8 tensor
    over the same memory (no copy; ``bytes(storage)`` goes through Python
    element by element and takes seconds per MiB). None for meta storage."""
    import torch
    if not isinstance(s, torch.UntypedStorage):
        s = s._untyped_storage
    if s.device.type == "meta":
        return None
    return torch.empty(0, dtype=torch.uint8, device=s.device).set_(s)


def _first_difference(x, y):
    import torch
    n = min(x.numel(), y.numel())
    bad = torch.nonzero(x[:n] != y[:n])
    i = int(bad[0]) if len(bad) else n
    return "sizes %d and %d bytes" % (x.numel(), y.numel()) if i == n else \
        "byte %d: %d != %d" % (i, int(x[i]), int(y[i]))


def _same_bytes(x, y, path):
    import torch
    if x is None or y is None:      # meta: nothing to compare but the shapes
        assert x is None and y is None, (path, "one of them is a meta tensor")
        return
    if not (x.numel() == y.numel() and torch.equal(x, y)):
        raise AssertionError("%s differs: %s" % (path, _first_difference(x, y)))


def same(a, b, path="obj", *, layout=False, ordered=False):
    """Assert ``a`` equals ``b``, bitwise: the same structure (dicts, lists,
    tuples), the same tensors (type of tensor, dtype, shape and the bytes of
    every element, compared through uint8 views: fast, and NaN equals the
    same NaN), and ``==`` for other values. Returns True, so ``assert
    same(a, b)`` reads as usual; a mismatch raises AssertionError naming
    where (``path``) and the first differing byte.

    ``layout=True`` also compares what torch.save keeps of a tensor's
    place in its storage: strides, storage offset, requires_grad, the
    exact types of containers and tensors, and the whole storage's bytes
    (the bytes outside a view included). ``ordered=True`` (implied by
    ``layout``) compares dicts' key order too."""
    import torch
    ordered = ordered or layout
    if layout:
        assert type(a) is type(b) or (isinstance(a, torch.Tensor) and
                                      isinstance(b, torch.Tensor)), (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), (path, type(b))
        assert a.dtype == b.dtype, (path, a.dtype, b.dtype)
        assert a.shape == b.shape, (path, tuple(a.shape), tuple(b.shape))
        assert a.layout == b.layout, (path, a.layout, b.layout)
        if layout:
            assert type(a) is type(b), (path, type(a), type(b))
            assert a.requires_grad == b.requires_grad, (path, "requires_grad")
        if a.is_sparse:
            return (same(a._indices(), b._indices(), path + "._indices()", layout=layout) and
                    same(a._values(), b._values(), path + "._values()", layout=layout))
        if a.layout != torch.strided:
            return same(a.to_dense(), b.to_dense(), path + ".to_dense()")
        if a.is_quantized:
            assert b.is_quantized and a.qscheme() == b.qscheme(), (path, "qscheme")
        if layout:
            assert a.stride() == b.stride(), (path, a.stride(), b.stride())
            assert a.storage_offset() == b.storage_offset(), (path, "storage offset")
            _same_bytes(storage_bytes(a.untyped_storage()), storage_bytes(b.untyped_storage()),
                        path + " (storage)")
        else:
            _same_bytes(byte_view(a), byte_view(b), path)
    elif isinstance(a, (torch.UntypedStorage, torch.storage.TypedStorage)):
        assert isinstance(b, (torch.UntypedStorage, torch.storage.TypedStorage)), (path, type(b))
        _same_bytes(storage_bytes(a), storage_bytes(b), path)
    elif isinstance(a, dict):
        assert isinstance(b, dict), (path, type(b))
        if ordered:
            assert list(a.keys()) == list(b.keys()), (path, list(a.keys()), list(b.keys()))
        else:
            assert a.keys() == b.keys(), (path, sorted(map(repr, a.keys() ^ b.keys())))
        for k in a:
            same(a[k], b[k], "%s[%r]" % (path, k), layout=layout, ordered=ordered)
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)), (path, type(b))
        assert len(a) == len(b), (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s[%d]" % (path, i), layout=layout, ordered=ordered)
    else:
        assert a == b, (path, a, b)
    return True


@contextlib.contextmanager
def low_gc_thresholds():
    """The cyclic collector's thresholds so low inside that a few hundred
    new objects start collections (checked at entry); yields the list to
    which the generation of every collection that starts is appended."""
    import gc
    events = []

    def note(phase, info):
        if phase == "start":
            events.append(info["generation"])
    old = gc.get_threshold()
    gc.collect()
    gc.set_threshold(10, 1, 1)
    gc.callbacks.append(note)
    try:
        junk = [[i] for i in range(100)]
        assert events, "the lowered thresholds started no collection"
        del events[:], junk
        yield events
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*old)
