"""Ctrl-C during a long blocking call raises KeyboardInterrupt promptly,
for every kind of buffer, and the op has ended (its buffer is safe to
free) when it does. Each case runs in a subprocess that gets SIGINT
while reading (or writing) a large file on tmpfs."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SHM = "/dev/shm"
SIZE = 3 << 30


@pytest.fixture(scope="module")
def big_file():
    if not os.path.isdir(SHM) or os.statvfs(SHM).f_bavail * os.statvfs(SHM).f_frsize < 3 * SIZE:
        pytest.skip("needs %d GiB free on %s" % (3 * SIZE >> 30, SHM))
    path = os.path.join(SHM, "nvio_sigint_%d.bin" % os.getpid())
    with open(path, "wb") as f:
        f.truncate(SIZE)          # sparse on tmpfs: reads are all memcpy of zeros
    yield path
    os.unlink(path)


CHILD = textwrap.dedent(r"""
    import os, sys, time, signal
    import nvio
    kind, call, path, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if kind == "torch":
        import torch
        buf = torch.ones(size, dtype=torch.uint8)
        tail = lambda: int(buf[-1])
    elif kind == "numpy":
        import numpy as np
        buf = np.ones(size, np.uint8)
        tail = lambda: int(buf[-1])
    else:
        buf = bytearray(b"\1") * size
        tail = lambda: buf[-1]
    h = nvio.AioHandle(engine="psync", direct=False, intra_op_parallelism=1)
    f = h.open(path)
    print("ready", flush=True)
    t0 = time.monotonic()
    try:
        for _ in range(100):          # long enough to be interrupted whatever the speed
            if call == "sync_pread":
                h.sync_pread(buf, path)
            elif call == "read":
                h.read(buf, path)
            elif call == "file_pread":
                f.pread(buf, 0)
            elif call == "future":
                f.pread_async(buf, 0).result()
    except KeyboardInterrupt:
        print("interrupted %.3f" % (time.monotonic() - t0), flush=True)
        del buf                       # the op has ended: freeing is safe
        h.close()
        sys.exit(42)
    print("not interrupted", flush=True)
    sys.exit(0)
""")


@pytest.mark.parametrize("call", ["sync_pread", "read", "file_pread", "future"])
@pytest.mark.parametrize("kind", ["torch", "numpy", "bytearray"])
def test_sigint_during_blocking_read(big_file, kind, call):
    if kind in ("torch", "numpy"):
        pytest.importorskip(kind)
    p = subprocess.Popen([sys.executable, "-c", CHILD, kind, call, big_file, str(SIZE)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        t = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
        took = time.monotonic() - t
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 42, (out, err)
    assert "interrupted" in out
    # promptly: well before 100 reads of 3 GiB could end, and within seconds
    assert took < 5, took
