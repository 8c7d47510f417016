"""fork: a parent's handle in a child fails clearly (ECHILD) and never
hangs; new_cpu_locked_tensor and RLIMIT_MEMLOCK; get_thread_count."""
import errno
import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest

import nvio
from nvio_testutil import write_file

FORK_CHILD = textwrap.dedent(r"""
    import errno, os, sys, nvio
    path, what = sys.argv[1], sys.argv[2]
    h = nvio.AioHandle()
    buf = bytearray(4096)
    f = h.open(path)
    h.sync_pread(buf, path)
    fut = f.pread_async(bytearray(4096), 0); fut.result(timeout=10)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if what == "use":
                try:
                    h.sync_pread(buf, path)
                    code = 3
                except nvio.NvioError as e:
                    code = 0 if e.errno == errno.ECHILD and "new handle" in str(e) else 4
            elif what == "future":
                try:
                    f.pread_async(buf, 0).result(timeout=5)
                    code = 3
                except nvio.NvioError as e:
                    code = 0 if e.errno == errno.ECHILD else 4
            elif what == "wait":
                try:
                    h.wait()
                    code = 3
                except nvio.NvioError as e:
                    code = 0 if e.errno == errno.ECHILD else 4
            elif what == "close":
                h.close()
            elif what == "gc":
                del f, fut, h
            h2 = nvio.AioHandle()          # a new handle works in the child
            h2.sync_pread(buf, path)
            h2.close()
        except BaseException as e:
            print("child:", repr(e), flush=True)
            code = 5
        os._exit(code)
    _, st = os.waitpid(pid, 0)
    h.sync_pread(buf, path)               # the parent's handle is unaffected
    f.pread_async(buf, 0).result(timeout=10)
    h.close()
    sys.exit(os.waitstatus_to_exitcode(st))
""")


@pytest.mark.parametrize("what", ["use", "future", "wait", "close", "gc"])
def test_parent_handle_in_forked_child(tmp_path, what):
    p = str(tmp_path / "f")
    write_file(p, b"x" * 4096)
    r = subprocess.run([sys.executable, "-c", FORK_CHILD, p, what], timeout=60,
                       capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout, r.stderr)


def _mp_worker(h, path, q):
    try:
        h.sync_pread(bytearray(16), path)
        q.put("no error")
    except nvio.NvioError as e:
        q.put(e.errno)


def test_multiprocessing_fork_worker(tmp_path):
    p = str(tmp_path / "f")
    write_file(p, b"x" * 16)
    ctx = multiprocessing.get_context("fork")
    with nvio.AioHandle() as h:
        q = ctx.Queue()
        w = ctx.Process(target=_mp_worker, args=(h, p, q))
        w.start()
        assert q.get(timeout=30) == errno.ECHILD
        w.join(timeout=30)
        assert w.exitcode == 0
        h.sync_pread(bytearray(16), p)


def test_get_thread_count_alias():
    with nvio.AioHandle(intra_op_parallelism=3) as h:
        assert h.get_thread_count() == 3 == h.get_intra_op_parallelism()


MEMLOCK_CHILD = textwrap.dedent(r"""
    import os, resource, sys, errno
    import torch, nvio                         # before dropping root: /root may be closed
    if os.getuid() == 0:
        os.setgid(65534); os.setuid(65534)     # root ignores RLIMIT_MEMLOCK (CAP_IPC_LOCK)
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))
    h = nvio.AioHandle()
    t = h.new_cpu_locked_tensor(1024, torch.zeros(1, dtype=torch.uint8))   # 4 KiB fits
    assert h.is_pinned(t), "small tensor not pinned"
    try:
        h.new_cpu_locked_tensor(16 << 20, torch.zeros(1, dtype=torch.uint8))
        print("no error"); sys.exit(3)
    except nvio.NvioError as e:
        assert "RLIMIT_MEMLOCK" in str(e) and "ulimit -l" in str(e) and "65536" in str(e), str(e)
    u = h.new_cpu_locked_tensor(16 << 20, torch.zeros(1, dtype=torch.uint8), allow_unlocked=True)
    assert u.numel() == 16 << 20 and not h.is_pinned(u)
    sys.exit(0)
""")


def test_locked_tensor_over_memlock_limit():
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, "-c", MEMLOCK_CHILD], timeout=120,
                       capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, (r.stdout, r.stderr)
