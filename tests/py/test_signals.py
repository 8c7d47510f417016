"""Ctrl-C during a long blocking call raises KeyboardInterrupt promptly, on
every engine, for every kind of buffer (torch tensor, NumPy array,
bytearray) and every blocking read (sync_pread, pread without async_op,
read, File.pread, a future's result()); when it does, nothing writes into
the buffer any more (it is filled with a marker after the interrupt and
checked a while later), so it is safe to free.

One child runs every case (engine, buffer, call) in turn, each a loop of reads of a
sparse file on tmpfs (128 MiB, more than two of the pieces a blocking call
cuts its transfer into) (page-cache copies of zeros, so the loop is long
by repetition however fast the machine); the parent sends SIGINT a moment
after the child says it started the case and expects the interruption
within seconds."""
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

SHM = "/dev/shm"
SIZE = (128 << 20) + 4096      # more than two of the blocking calls' 64 MiB pieces
KINDS = ("torch", "numpy", "bytearray")
CALLS = ("sync_pread", "pread", "read", "file_pread", "future")
LINE_TIMEOUT = 120             # s without a line from the child: it hung
AFTER = 0.15                  # the parent's wait from "ready" to SIGINT


@pytest.fixture(scope="module")
def big_file():
    if not os.path.isdir(SHM) or os.statvfs(SHM).f_bavail * os.statvfs(SHM).f_frsize < 2 * SIZE:
        pytest.skip("needs %d MiB free on %s" % (2 * SIZE >> 20, SHM))
    path = os.path.join(SHM, "nvio_sigint_%d_%s.bin" % (os.getpid(), os.urandom(4).hex()))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, SIZE)    # sparse: reads are copies of zeros
    finally:
        os.close(fd)
    yield path
    os.unlink(path)


CHILD = textwrap.dedent(r"""
    import os, sys, time
    import nvio
    path, size = sys.argv[1], int(sys.argv[2])
    cases = [c.split(":") for c in sys.argv[3:]]
    h = f = None
    WAIT_READS = 96

    # a marker in the first byte of every page: a late read (of zeros)
    # would overwrite some
    def make(kind):
        if kind == "torch":
            import torch
            b = torch.ones(size, dtype=torch.uint8)
            return b, lambda v: b[::4096].fill_(v), lambda v: bool((b[::4096] == v).all())
        if kind == "numpy":
            import numpy as np
            b = np.ones(size, np.uint8)
            def fill(v):
                b[::4096] = v
            return b, fill, lambda v: bool((b[::4096] == v).all())
        b = bytearray(b"\1") * size
        n = len(range(0, size, 4096))
        def fill(v):
            b[::4096] = bytes([v]) * n
        return b, fill, lambda v: b[::4096].count(bytes([v])) == n

    for engine, kind, call in cases:
        if h is None or h.get_engine() != engine:
            if h is not None:
                f.close()
                h.close()
            h = nvio.AioHandle(engine=engine, direct=False, intra_op_parallelism=2)
            f = h.open(path)
        buf, fill, all_are = make(kind)
        fut = None
        print("ready", engine, kind, call, flush=True)
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < 60:
                if call == "sync_pread":
                    h.sync_pread(buf, path)
                elif call == "pread":
                    h.pread(buf, path, False, False, 0)
                elif call == "read":
                    h.read(buf, path)
                elif call == "file_pread":
                    f.pread(buf, 0)
                elif call == "future":
                    fut = f.pread_async(buf, 0)
                    fut.result()
                elif call == "wait":
                    # one wait for many async reads: seconds of copying
                    for _ in range(WAIT_READS):
                        h.async_pread(buf, path)
                    print("waiting", flush=True)
                    h.wait()
            print("not interrupted", flush=True)
            sys.exit(1)
        except KeyboardInterrupt:
            took = time.monotonic() - t0 - float(os.environ.get("NVIO_TEST_SIGINT_AFTER", 0))
        if call == "wait":
            # the interrupted wait reported nothing: the reads go on,
            # holding the buffer, and the next wait reports them
            h.wait()
        if call == "future":
            # the future's op goes on, holding the buffer; and an interrupt
            # that lands between a submit and its future's return leaves an
            # op with no future: closing the file waits for every op on it
            f.close()
            f = h.open(path)
        fill(0x5A)                # nothing may write into it from now on
        time.sleep(0.2)
        print("interrupted", engine, kind, call, "%.3f" % took, "intact" if all_are(0x5A) else "WRITTEN",
              flush=True)
        del buf, fill, all_are, fut
    f.close()
    h.close()
    print("done", flush=True)
""")


def test_sigint_during_blocking_reads(big_file):
    import nvio
    cases = []
    for engine in ("io_uring", "libaio", "psync"):
        ok, why = nvio.engine_available(engine)
        if not ok:
            print("skip engine %s: %s" % (engine, why))
            continue
        for kind in KINDS:
            try:
                __import__(kind) if kind != "bytearray" else None
            except ImportError:
                continue
            cases += ["%s:%s:%s" % (engine, kind, c) for c in CALLS]
        # handle.wait() for many async reads (seconds of copying): once per
        # engine, into a bytearray (the wait itself sees no buffer)
        cases.append("%s:bytearray:wait" % engine)
    env = dict(os.environ, NVIO_TEST_SIGINT_AFTER=str(AFTER))
    p = subprocess.Popen([sys.executable, "-c", CHILD, big_file, str(SIZE)] + cases,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    # the child's lines through a thread, so that a child that hangs fails
    # the test after LINE_TIMEOUT instead of hanging the suite
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in p.stdout] + [lines.put("")],
                     daemon=True).start()

    class _Out:
        @staticmethod
        def readline():
            try:
                return lines.get(timeout=LINE_TIMEOUT)
            except queue.Empty:
                p.kill()
                pytest.fail("the child printed nothing for %d s (hung)" % LINE_TIMEOUT)
    out = _Out()
    results = []
    try:
        for case in cases:
            line = out.readline().split()
            assert line[:1] == ["ready"], (case, line, p.stderr.read() if p.poll() else "")
            if case.endswith(":wait"):
                line = out.readline().split()
                assert line[:1] == ["waiting"], (case, line)
            time.sleep(AFTER)
            p.send_signal(signal.SIGINT)
            results.append((case, out.readline().split()))
        assert out.readline().strip() == "done"
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    for case, line in results:
        assert line[:1] == ["interrupted"], (case, line)
        assert line[-1] == "intact", (case, line)    # no op wrote after the exception
        # promptly: from the signal to the exception (the child's clock, less
        # the parent's wait), one slice of the call and the pieces in flight
        assert float(line[4]) < 3, (case, line)
        if case.endswith(":wait"):
            # the reads behind the wait take seconds more: a wait that
            # ignored Ctrl-C until they ended would take that long
            assert float(line[4]) < 1, (case, line)
