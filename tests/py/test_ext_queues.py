"""Completions per consumer in the extension (issue 31 item 3): the user's
Handle.submit/reap, the futures layer and blocking calls each have a queue
of their own, so none of them takes another's completions; Handle.queue()
gives a Queue of one's own. Every engine."""
import os
import select
import threading

import pytest

import nvio
from nvio_testutil import pattern, write_file

BIG = 80 << 20        # a blocking call well over the size it makes a private queue for


def _sparse(path, size, head=b""):
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)


def test_user_reap_and_futures_never_see_each_others_completions(engine, tmp_path):
    p = tmp_path / "d.bin"
    blob = pattern(64 * 4096, 3)
    write_file(p, blob)
    with nvio.AioHandle(engine=engine, direct=False) as h, h.open(p) as f:
        futs = []
        for rnd in range(20):
            mine = [bytearray(4096) for _ in range(64)]
            assert h.submit([(nvio.OP_READ, f, mine[i], i * 4096, ("mine", rnd, i))
                             for i in range(64)]) == 64
            futs += [f.pread_async(bytearray(4096), i * 4096) for i in range(64)]
            got = []
            while len(got) < 64:
                more = h.reap(256, 1, 10)
                assert more, "the user's ops did not come back"
                got += more
            # only the user's ops, each once, never a future's
            assert sorted(u for u, _ in got) == [("mine", rnd, i) for i in range(64)]
            assert all(r == 4096 for _, r in got)
            assert b"".join(mine) == blob
        assert [fu.result(10) for fu in futs] == [4096] * len(futs)
        assert h.inflight == 0


def test_completion_fd_stays_readable_across_a_blocking_call(engine, tmp_path):
    p = tmp_path / "big.bin"
    _sparse(p, BIG, b"h" * 4096)
    with nvio.AioHandle(engine=engine, direct=False) as h, h.open(p) as f:
        fd = h.completion_fd()
        small = bytearray(4096)
        assert h.submit([(nvio.OP_READ, f, small, 0, "mine")]) == 1
        assert select.select([fd], [], [], 10)[0] == [fd]     # it ended
        big = bytearray(BIG)
        assert f.pread(big, 0) == BIG
        assert h.sync_pread(big, str(p)) == 1
        # the blocking calls reaped nothing of the user's: the completion
        # still waits, and the eventfd still says so
        assert select.select([fd], [], [], 0)[0] == [fd]
        assert h.inflight == 1
        assert h.reap(8, 0, 0) == [("mine", 4096)]
        assert bytes(small) == b"h" * 4096 and big[:4096] == b"h" * 4096


def test_queue_of_ones_own(engine, tmp_path):
    p = tmp_path / "q.bin"
    blob = pattern(1 << 20, 5)
    write_file(p, blob)
    with pytest.raises(TypeError):
        nvio._nvio.Queue()
    h = nvio.AioHandle(engine=engine, direct=False)
    f = h.open(p)
    q = h.queue()
    a, b = bytearray(1 << 20), bytearray(4096)
    assert q.submit([(nvio.OP_READ, f, a, 0, "q")]) == 1
    assert h.submit([(nvio.OP_READ, f, b, 4096, "h")]) == 1
    fd = q.completion_fd()
    assert select.select([fd], [], [], 10)[0] == [fd]
    assert q.reap(8, 1, 10) == [("q", 1 << 20)]
    assert h.reap(8, 1, 10) == [("h", 4096)]
    assert bytes(a) == blob and bytes(b) == blob[4096:8192]
    assert q.inflight == 0 and h.inflight == 0
    # an op never reaped keeps its buffer until the queue closes
    c = bytearray(4096)
    pending = set()
    assert q.submit([(nvio.OP_READ, f, c, 0, "late")], pending=pending) == 1
    assert pending == {"late"} and q.inflight == 1
    q.close()
    q.close()                                  # idempotent
    assert q.closed and q.inflight == 0
    with pytest.raises(ValueError):
        q.reap(1, 0, 0)
    assert bytes(c) == blob[:4096]
    # a queue closes with its handle; a file of another handle is refused
    q2 = h.queue()
    with nvio.AioHandle(engine=engine, direct=False) as other, other.open(p) as g:
        with pytest.raises(ValueError, match="another handle"):
            q2.submit([(nvio.OP_READ, g, bytearray(8), 0)])
    assert q2.submit([(nvio.OP_READ, f, bytearray(8), 0, 1)]) == 1
    h.close()
    assert q2.closed
    with pytest.raises(ValueError):
        q2.submit([(nvio.OP_READ, f, bytearray(8), 0)])
    with pytest.raises(ValueError):
        h.queue()


def test_queue_reaped_by_a_thread_while_another_submits(engine, tmp_path):
    p = tmp_path / "t.bin"
    blob = pattern(256 * 1024, 9)
    write_file(p, blob)
    with nvio.AioHandle(engine=engine, direct=False) as h, h.open(p) as f:
        q = h.queue()
        n = 400
        seen = []

        def reaper():
            while len(seen) < n:
                seen.extend(q.reap(64, 1, 5))

        t = threading.Thread(target=reaper)
        t.start()
        bufs = [bytearray(4096) for _ in range(n)]
        for i in range(n):
            off = (i % 64) * 4096
            assert q.submit([(nvio.OP_READ, f, bufs[i], off, i)]) == 1
        t.join(60)
        assert not t.is_alive()
        assert sorted(u for u, _ in seen) == list(range(n))
        assert all(bytes(bufs[i]) == blob[(i % 64) * 4096:(i % 64 + 1) * 4096]
                   for i in range(n))
        q.close()


CANCEL_CHILD = r"""
import os, sys, numpy as np, nvio
path, engine, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
buf = np.empty(size, np.uint8)
h = nvio.AioHandle(engine=engine, direct=False)
f = h.open(path, nvio.FILE_ATOMIC)
inside, v = False, 0
try:
    while True:
        v = v % 255 + 1
        buf.fill(v)               # each write its own byte: a torn one shows
        if v == 2:                # the second write, over the first: go now
            print("ready", flush=True)
        inside = True
        f.pwrite(buf, 0)
        inside = False
except KeyboardInterrupt:
    pass
if not inside:            # the signal came between two calls: no op to cancel
    print("between", flush=True)
    sys.exit(0)
try:
    f.commit()
except nvio.NvioError as e:
    print("refused", e.errno, os.path.exists(path), flush=True)
else:
    # the cancel came once every piece had started: the write completed
    whole = os.path.getsize(path) == size
    if whole:
        m = np.memmap(path, np.uint8, "r")
        whole = all(bool((m[o:o + (64 << 20)] == v).all()) for o in range(0, size, 64 << 20))
        del m
    print("committed", "whole" if whole else "TORN", flush=True)
    os.unlink(path)
f.close()
h.close()
"""


def test_ctrl_c_cancels_a_blocking_write_and_its_atomic_file_refuses_to_commit(engine, np):
    """The interrupted pwrite's op is cancelled (pieces not started are
    skipped), so the file holds a write that did not complete: an ATOMIC
    file must not commit it (the old chunked runner committed it torn).
    A cancel that comes once every piece has started is too late (the op
    completes as it would have): then the commit holds the whole write."""
    import signal
    import subprocess
    import sys
    import time
    # more than the old runner kept in flight (4 pieces of up to 64 MiB),
    # which ended the write whole
    shm, size = "/dev/shm", 768 << 20
    if not os.path.isdir(shm) or os.statvfs(shm).f_bavail * os.statvfs(shm).f_frsize < 4 * size:
        pytest.skip("needs %d MiB free on %s" % (4 * size >> 20, shm))
    path = os.path.join(shm, "nvio_cancel_%d_%s.bin" % (os.getpid(), os.urandom(4).hex()))
    for _ in range(5):
        p = subprocess.Popen([sys.executable, "-c", CANCEL_CHILD, path, engine, str(size)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # the child says "ready" right before its second write (with a
            # fill of 768 MiB between writes, a loaded CI once had five
            # signals in a row land between two writes)
            assert p.stdout.readline().split() == ["ready"], p.stderr.read()
            time.sleep(0.005)
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        if out.split()[:1] != ["between"]:
            break
    assert out.split() in (["refused", "5", "False"], ["committed", "whole"]), (out, err)
    assert not os.path.exists(path)


DYING_HANDLE_CHILD = r"""
import gc, sys
from nvio import _nvio
class H(_nvio.Handle):      # a subclass has an instance dict, as AioHandle's users' do
    pass
for i in range(200):
    h = H(engine=sys.argv[1])
    h.q = h.queue()          # dropped with the dict, before Handle's own dealloc
    h.other = [h.queue(), h.queue()]
    del h
    gc.collect()
print("ok", flush=True)
"""


def test_a_handle_dropped_with_its_queues_in_its_dict_is_freed_once(engine):
    """A Queue held in a Handle subclass's instance dict is closed while the
    handle's count is already 0 (the dict goes before Handle's dealloc):
    the close took and dropped a reference to the handle, and that second
    dealloc freed it twice (a segfault in the garbage collector later)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", DYING_HANDLE_CHILD, engine],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["ok"], (r.returncode, r.stdout,
                                                              r.stderr[-2000:])
