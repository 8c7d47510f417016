"""The completions -> futures layer (nvio._futures) on every engine, direct on and off."""
import asyncio
import concurrent.futures
import errno
import gc
import os
import random
import threading
import weakref

import pytest

import nvio
from nvio_testutil import pattern, read_file, write_file

RW = nvio.FILE_READ | nvio.FILE_WRITE | nvio.FILE_CREATE


def _reapers():
    return [t for t in threading.enumerate() if t.name == "nvio-reaper"]


def test_many_ops_resolve_once_with_their_results(handle, np, tmp_path):
    p = tmp_path / "m.bin"
    n = 300
    sizes = [random.Random(i).randint(1, 9000) for i in range(n)]
    offs = [sum(sizes[:i]) for i in range(n)]
    blob = pattern(sum(sizes), 1)
    calls = {}
    with handle.open(p, RW) as f:
        ops = [(nvio.OP_WRITE, f, np.frombuffer(blob, np.uint8, s, o).copy(), o, ("w", i))
               for i, (s, o) in enumerate(zip(sizes, offs))]
        futs = handle.submit_async(ops)
        for fu in futs:
            fu.add_done_callback(lambda x: calls.__setitem__(x.user_data,
                                                             calls.get(x.user_data, 0) + 1))
        assert [fu.result(10) for fu in futs] == sizes
        assert [fu.user_data for fu in futs] == [("w", i) for i in range(n)]
        assert read_file(p) == blob
        outs = [np.zeros(s, np.uint8) for s in sizes]
        rfuts = [f.pread_async(outs[i], offs[i]) for i in range(n)]
        concurrent.futures.wait(rfuts, timeout=10)
        assert all(fu.done() and fu.result() == s for fu, s in zip(rfuts, sizes))
    assert b"".join(a.tobytes() for a in outs) == blob
    assert all(v == 1 for v in calls.values()) and len(calls) == n
    assert handle.pending() == 0              # wait() does not see tagged ops


def test_partial_failures_fail_exactly_those_futures(engine, tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    p = tmp_path / "ok.bin"
    with nvio.AioHandle(engine=engine, direct=False) as h:
        good = h.open(p, RW)
        full = h.open("/dev/full", nvio.FILE_WRITE)
        ops = []
        for i in range(40):
            if i % 7 == 3:
                ops.append((nvio.OP_WRITE, full, b"y" * 4097, 0, i))
            else:
                ops.append((nvio.OP_WRITE, good, pattern(1000, i), i * 1000, i))
        futs = h.submit_async(ops)
        done, not_done = concurrent.futures.wait(futs, timeout=10)
        assert not not_done
        for i, fu in enumerate(futs):
            if i % 7 == 3:
                e = fu.exception()
                assert isinstance(e, nvio.NvioError)
                assert e.errno == errno.ENOSPC
                assert e.filename == "/dev/full" and e.offset == 0
            else:
                assert fu.exception() is None and fu.result() == 1000
        good.close()
    data = read_file(p)
    for i in range(40):
        if i % 7 != 3:
            assert data[i * 1000:(i + 1) * 1000] == pattern(1000, i)


def test_refused_ops(handle, tmp_path):
    p = tmp_path / "r.bin"
    write_file(p, pattern(8192, 2))
    with handle.open(p) as f:
        b1, b2 = bytearray(4096), bytearray(4096)
        ops = [(nvio.OP_READ, f, b1, 0), (nvio.OP_READ, f, bytearray(10), 9000),
               (nvio.OP_READ, f, b2, 4096)]
        futs = handle.submit_async(ops, refused="future")
        assert futs[0].result(10) == 4096 and futs[2].result(10) == 4096
        e = futs[1].exception(10)
        assert e.errno == errno.ENODATA and e.filename == p and e.offset == 9000
        with pytest.raises(nvio.NvioError) as ei:
            f.pread_async(bytearray(10), 9000)     # a single op raises at submit
        assert ei.value.errno == errno.ENODATA
    assert bytes(b1 + b2) == pattern(8192, 2)


def test_asyncio_await(handle, torch, tmp_path):
    p = tmp_path / "aio.bin"
    data = pattern(1 << 20, 3)

    async def main():
        with handle.open(p, RW) as f:
            t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            assert await f.pwrite_async(t, 0) == len(data)
            outs = [torch.zeros(1 << 18, dtype=torch.uint8) for _ in range(4)]
            got = await asyncio.gather(*(f.pread_async(o, i << 18) for i, o in enumerate(outs)))
            assert got == [1 << 18] * 4
            return torch.cat(outs)

    back = asyncio.run(main())
    assert bytes(back.numpy()) == data
    assert read_file(p) == data


def test_buffers_kept_alive_until_resolved(handle, torch, np, tmp_path):
    p = tmp_path / "alive.bin"
    data = pattern((5 << 20) + 3, 4)
    with handle.open(p, RW) as f:
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        ref = weakref.ref(t)
        fut = f.pwrite_async(t, 0)
        del t
        gc.collect()
        assert fut.result(10) == len(data)
        gc.collect()
        assert ref() is None                   # released once reaped
        a = np.zeros(len(data), np.uint8)
        view = memoryview(a)
        fut = f.pread_async(a, 0)
        del a
        gc.collect()
        assert fut.result(10) == len(data)
    assert bytes(view) == data
    assert read_file(p) == data


def test_vectors_async_thousands_of_odd_pieces(handle, np, torch, tmp_path):
    p = tmp_path / "vec.bin"
    r = random.Random(5)
    sizes = [r.randint(1, 2500) for _ in range(3000)]
    blob = pattern(sum(sizes), 5)
    pieces, o = [], 0
    for i, s in enumerate(sizes):
        chunk = bytearray(blob[o:o + s])
        pieces.append(np.frombuffer(chunk, np.uint8) if i % 2 else
                      torch.frombuffer(chunk, dtype=torch.uint8))
        o += s
    with handle.open(p, RW) as f:
        assert f.pwritev_async(pieces, 0).result(30) == len(blob)
        outs = [np.zeros(s, np.uint8) for s in sizes]
        assert f.preadv_async(outs, 0).result(30) == len(blob)
    assert read_file(p) == blob
    assert b"".join(a.tobytes() for a in outs) == blob


def test_one_reaper_per_handle_stops_at_close(engine, tmp_path):
    before = len(_reapers())
    h = nvio.AioHandle(engine=engine, direct=False)
    f = h.open(tmp_path / "one.bin", RW)
    futs = [f.pwrite_async(pattern(100, i), i * 100) for i in range(200)]
    assert len(_reapers()) == before + 1       # no thread per op
    assert len(h.submit_async([(nvio.OP_WRITE, f, b"z", 20000)])) == 1
    h.close()                                  # resolves every future first
    assert all(fu.done() for fu in futs)
    assert [fu.result() for fu in futs] == [100] * 200
    assert len(_reapers()) == before
    with pytest.raises(ValueError):
        h.submit_async([(nvio.OP_WRITE, f, b"z", 0)])


def test_futures_cannot_be_cancelled_and_bad_ops_raise(handle, tmp_path):
    p = tmp_path / "c.bin"
    with handle.open(p, RW) as f:
        fut = f.pwrite_async(b"x" * 100000, 0)
        assert not fut.cancel()                 # running: the bytes are moving
        assert fut.result(10) == 100000
        ok = (nvio.OP_WRITE, f, b"y", 0)
        with pytest.raises(TypeError):           # a malformed op: no future fails for it
            handle.submit_async([ok, (nvio.OP_WRITE, f, object(), 1)], refused="future")
        with pytest.raises(TypeError):
            handle.submit_async([(1, 2)])
    assert read_file(p)[:1] == b"x"


def test_threads_share_one_handle(handle, tmp_path):
    p = tmp_path / "t.bin"
    n, sz = 8, 3001
    with handle.open(p, RW) as f:
        results = [None] * n

        def worker(k):
            futs = [f.pwrite_async(pattern(sz, k * 100 + i), (k * 50 + i) * sz)
                    for i in range(50)]
            results[k] = [fu.result(30) for fu in futs]

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert results == [[sz] * 50] * n
    data = read_file(p)
    for k in range(n):
        for i in range(50):
            o = (k * 50 + i) * sz
            assert data[o:o + sz] == pattern(sz, k * 100 + i)


INTERRUPTS = r"""
import _thread, os, random, signal, sys, threading, time
import nvio
from nvio._futures import completions
engine, path = sys.argv[1], sys.argv[2]
h = nvio.AioHandle(engine=engine, direct=False)
f = h.open(path, nvio.FILE_READ)
buf = bytearray(4096)
stop = threading.Event()
armed = False

def on_sigint(signum, frame):
    # raises only inside the nvio calls below, once per arming: an
    # interrupt landing in this script's own bookkeeping (a loop test, an
    # except clause) must not escape it
    global armed
    if armed:
        armed = False
        raise KeyboardInterrupt

signal.signal(signal.SIGINT, on_sigint)

def interrupter():
    r = random.Random(1)
    while not stop.is_set():
        time.sleep(r.uniform(0, 0.002))
        _thread.interrupt_main(signal.SIGINT)

t = threading.Thread(target=interrupter, daemon=True)
t.start()
hits = ok = 0
t0 = time.monotonic()
while time.monotonic() - t0 < 4:
    try:
        armed = True
        n = f.pread_async(buf, 0).result(10)
        armed = False
        ok += n == 4096
    except KeyboardInterrupt:
        hits += 1
armed = False
stop.set()
t.join()
c = completions(h)
drained = c.drain(10)
cpu0, w0 = time.process_time(), time.monotonic()
time.sleep(1.0)                 # idle: the reaper must sleep, not spin
idle_cpu = (time.process_time() - cpu0) / (time.monotonic() - w0)
f.close()
h.close()
print(dict(hits=hits, ok=ok, drained=drained, pending=c.pending, idle_cpu=idle_cpu))
"""


def test_interrupts_anywhere_leave_no_orphan_op(engine, tmp_path):
    """KeyboardInterrupts landing anywhere in submit and result(), thousands
    of times: every op that was accepted still resolves, none is counted
    that was not, and the reaper sleeps afterwards (an interrupt between a
    Python-side registration and the C submit used to leave a token with
    no op: the reaper spun at 100% CPU and drain() never returned)."""
    import subprocess
    import sys
    p = tmp_path / "i.bin"
    write_file(p, pattern(4096, 3))
    r = subprocess.run([sys.executable, "-c", INTERRUPTS, engine, str(p)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = eval(r.stdout.strip().splitlines()[-1])
    assert out["hits"] > 100 and out["ok"] > 100, out
    assert out["drained"] and out["pending"] == 0, out
    assert out["idle_cpu"] < 0.3, out


def test_an_interrupt_at_any_line_of_submit_leaves_no_orphan(engine, tmp_path):
    """A KeyboardInterrupt raised at each line of Completions.submit in
    turn (a tracer raises it there, once): afterwards drain() returns and
    nothing is pending. An interrupt between a Python-side registration of
    the op and the C submit used to leave a token no op would complete:
    drain() never returned and the reaper spun."""
    import sys
    from nvio import _futures
    p = tmp_path / "l.bin"
    write_file(p, pattern(4096, 4))
    code = _futures.Completions.submit.__code__
    lines = sorted({ln for _, _, ln in code.co_lines() if ln is not None})
    h = nvio.AioHandle(engine=engine, direct=False)
    f = h.open(p, nvio.FILE_READ)
    buf = bytearray(4096)
    c = _futures.completions(h)
    hits = 0
    try:
        for target in lines:
            fired = []

            def local(frame, event, arg, target=target, fired=fired):
                if event == "line" and frame.f_lineno == target and not fired:
                    fired.append(1)
                    raise KeyboardInterrupt
                return local

            sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
            try:
                f.pread_async(buf, 0).result(10)
            except KeyboardInterrupt:
                hits += 1
            finally:
                sys.settrace(None)
            assert c.drain(5), "an interrupt at line %d left an op pending" % target
            assert c.pending == 0
        assert hits > 10
        assert bytes(buf) == pattern(4096, 4)
    finally:
        if c.pending == 0:      # else closing would wait forever for the orphan
            f.close()
            h.close()


def test_done_resolves_ended_ops_without_the_reaper(engine, np, tmp_path, monkeypatch):
    """done() on a pending future takes what has ended from the futures'
    queue itself, on the calling thread: with the reaper never started
    (as when it cannot get the GIL from a thread that releases and retakes
    it every few microseconds), polling done() resolves every future with
    its bytes and empties pending; the file holds the bytes and a read
    back matches. A future with a callback is left to the reaper: done()
    reaps nothing while it is pending, and its callback runs on the
    reaper once that starts."""
    import time
    monkeypatch.setattr(nvio._futures.Completions, "_start_locked", lambda self: None)
    p = tmp_path / "poll.bin"
    blob = pattern(64 * 5000, 4)
    ran_on = []

    def poll_until_done(fu, deadline):
        while not fu.done() and time.monotonic() < deadline:
            time.sleep(0.001)
        return fu.done()
    with nvio.AioHandle(engine=engine, direct=False) as h, h.open(p, RW) as f:
        c = nvio._futures.completions(h)
        try:
            futs = [f.pwrite_async(np.frombuffer(blob, np.uint8, 5000, i * 5000).copy(),
                                   i * 5000) for i in range(64)]
            assert c._thread is None
            deadline = time.monotonic() + 20
            assert all(poll_until_done(fu, deadline) for fu in futs), \
                "done() never saw the ops end"
            assert [fu.result(0) for fu in futs] == [5000] * 64 and c.pending == 0
            out = np.zeros(len(blob), np.uint8)
            r = f.pread_async(out, 0)
            assert poll_until_done(r, time.monotonic() + 20)
            assert r.result(0) == len(blob) and out.tobytes() == blob
            # a callback: done() leaves its future (and every other) to the reaper
            cb = f.pwrite_async(b"z" * 10, 0)
            cb.add_done_callback(lambda x: ran_on.append(threading.current_thread().name))
            other = f.pwrite_async(b"y" * 10, 20)
            time.sleep(0.2)         # both ended long since
            assert not cb.done() and not other.done() and ran_on == []
            assert c._thread is None
        finally:                # the reaper: the callback's, and close() waits for it
            monkeypatch.undo()
            with c._lock:
                c._start_locked()
                c._work.notify()
        assert cb.result(20) == 10 and other.result(20) == 10
        assert ran_on == ["nvio-reaper"]
        assert poll_until_done(f.pwrite_async(b"x" * 10, 0), time.monotonic() + 20)
    assert read_file(p) == b"x" * 10 + blob[10:20] + b"y" * 10 + blob[30:]


def test_done_polls_while_the_reaper_reaps(engine, np, tmp_path, monkeypatch):
    """Threads polling done() and the reaper reap one queue at once: each
    of 3,000 writes and 3,000 reads is resolved with its own result (a
    completion lost would leave a future unresolved, one taken twice would
    free its op's borrows twice); some were taken by the pollers; the
    bytes read back are the bytes written."""
    p = tmp_path / "race.bin"
    n, size = 3000, 512
    blob = pattern(n * size, 5)
    by = set()
    orig = nvio._futures.Completions._resolve

    def resolve(self, done):
        if done:
            by.add(threading.current_thread().name)
        return orig(self, done)
    monkeypatch.setattr(nvio._futures.Completions, "_resolve", resolve)
    with nvio.AioHandle(engine=engine, direct=False) as h, h.open(p, RW) as f:
        futs = []
        stop = threading.Event()

        def poller():           # the newest futures: those still pending
            while not stop.is_set():
                for fu in futs[-32:]:
                    fu.done()
        pollers = [threading.Thread(target=poller, name="poller-%d" % i) for i in range(3)]
        for t in pollers:
            t.start()
        try:
            for i in range(n):
                futs.append(f.pwrite_async(np.frombuffer(blob, np.uint8, size, i * size).copy(),
                                           i * size))
            assert [fu.result(30) for fu in futs] == [size] * n
            outs = [np.zeros(size, np.uint8) for _ in range(n)]
            rfuts = [f.pread_async(outs[i], i * size) for i in range(n)]
            futs += rfuts
            assert [fu.result(30) for fu in rfuts] == [size] * n
        finally:
            stop.set()
            for t in pollers:
                t.join(30)
        assert nvio._futures.completions(h).pending == 0
    assert any(b.startswith("poller-") for b in by), "no poller took a completion"
    assert b"".join(o.tobytes() for o in outs) == blob
