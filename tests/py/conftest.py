"""Shared fixtures for the nvio Python tests.

Every I/O test runs on every engine (skipped where nvio says it cannot run
here) and with direct I/O on and off (on is skipped where the file system
refuses O_DIRECT). Tests needing torch or numpy skip when it is absent.
"""
import gc
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

# A suite started in the background of a non-interactive shell (`cmd &`,
# nohup) gets SIGINT ignored, and every child process would inherit that:
# the Ctrl-C tests would then wait for an interrupt that never lands. A
# caught signal is reset to its default across exec, so catching it here
# gives this process and its children Python's usual KeyboardInterrupt.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

try:
    import nvio  # noqa: F401  (installed with pip install .)
except ImportError:  # an in-place build: python setup.py build_ext --inplace
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import nvio  # noqa: F401

ENGINES = ("io_uring", "libaio", "psync")
# Modules in this directory that are not the binding's (they get no fixtures).
OTHERS = ("test_cli.py",)


# Tests that time something against a bound (Ctrl-C lands within a second,
# ticks while a call holds no GIL, a late rank named after its timeout):
# marked "serial", so that scripts/test.sh runs them after the rest, alone
# (pytest-xdist runs the rest three at a time, beside the C stages). Module
# names (every test in it) or module::test name (every parametrization).
SERIAL = ("test_signals.py", "test_gil.py",
          "test_offload_trust.py::test_ctrl_c_lands_within_a_second_on_a_slow_device",
          "test_dead_ranks.py::test_a_late_rank_is_named_as_late_at_the_timeout",
          "test_hostile.py::test_fifo_refused_without_blocking",
          "test_testutil.py::test_big_tensors_are_quick",
          "test_futures.py::test_interrupts_anywhere_leave_no_orphan_op")


def pytest_configure(config):
    config.addinivalue_line("markers", "serial: times something; scripts/test.sh runs it alone, "
                                       "after the tests that run in parallel")


def pytest_collection_modifyitems(config, items):
    for item in items:
        mod = os.path.basename(str(item.fspath))
        name = getattr(item, "originalname", None) or item.name
        if mod in SERIAL or "%s::%s" % (mod, name) in SERIAL:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(autouse=True)
def _explicit_choices_win(request, monkeypatch):
    """The binding's tests pick engines and direct modes explicitly: the
    environment (NVIO_ENGINE, NVIO_DIRECT, a tuned file) must not override them."""
    if os.path.basename(str(request.node.fspath)) in OTHERS:
        return
    for var in ("NVIO_ENGINE", "NVIO_DIRECT", "NVIO_TUNED_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NVIO_NO_TUNED", "1")


def pytest_report_header(config):
    import nvio
    lines = ["nvio %s from %s" % (nvio.__version__, os.path.dirname(nvio.__file__))]
    for e in ENGINES:
        ok, why = nvio.engine_available(e)
        lines.append("  engine %-8s %s" % (e, "available" if ok else "unavailable: " + why))
    return lines


@pytest.fixture(params=ENGINES)
def engine(request):
    import nvio
    ok, why = nvio.engine_available(request.param)
    if not ok:
        pytest.skip("engine %s unavailable: %s" % (request.param, why))
    return request.param


@pytest.fixture(params=[False, True], ids=["buffered", "direct"])
def direct(request, tmp_path):
    import nvio
    if request.param and not nvio.probe(str(tmp_path))["direct_ok"]:
        pytest.skip("O_DIRECT not supported in %s" % tmp_path)
    return request.param


@pytest.fixture
def handle(engine, direct):
    import nvio
    h = nvio.AioHandle(engine=engine, direct=direct)
    yield h
    h.close()


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def np():
    return pytest.importorskip("numpy")


# The LD_PRELOAD fault shim (faultlib/fault_preload.c), built once per module
# that asks for it.
@pytest.fixture(scope="module")
def preload(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build the fault shim")
    out = tmp_path_factory.mktemp("fault") / "fault_preload.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out),
                        os.path.join(os.path.dirname(os.path.abspath(__file__)), "faultlib", "fault_preload.c"), "-ldl"],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.fail("building the fault shim failed:\n" + r.stderr)
    return str(out)


@pytest.fixture
def tmpfs(tmp_path):
    """Mounts small tmpfs file systems (root only); unmounts afterwards."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mounted = []

    def make(name, opts, fstype="tmpfs"):
        d = tmp_path / name
        d.mkdir()
        r = subprocess.run(["mount", "-t", fstype, "-o", opts, fstype,
                            str(d)], capture_output=True)
        if r.returncode:
            pytest.skip("mount -t tmpfs failed: %s" % r.stderr.decode())
        mounted.append(d)
        return d

    yield make
    for d in mounted:
        # A file closed a moment ago may still be held by the kernel (an
        # io_uring worker's deferred release, a cycle not yet collected):
        # collect, retry for a while, and detach it lazily at last rather
        # than leave a mount that breaks pytest's cleanup of old runs.
        gc.collect()
        for _ in range(50):
            if subprocess.run(["umount", str(d)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)
