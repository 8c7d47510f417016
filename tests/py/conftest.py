"""Shared fixtures for the nvio Python tests.

Every I/O test runs on every engine (skipped where nvio says it cannot run
here) and with direct I/O on and off (on is skipped where the file system
refuses O_DIRECT). Tests needing torch or numpy skip when it is absent.
"""
import os
import sys

import pytest

# Explicit choices in the tests must not be overridden by the environment.
for _var in ("NVIO_ENGINE", "NVIO_DIRECT"):
    os.environ.pop(_var, None)
os.environ["NVIO_NO_TUNED"] = "1"

try:
    import nvio  # noqa: F401  (installed with pip install .)
except ImportError:  # an in-place build: python setup.py build_ext --inplace
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import nvio  # noqa: F401

ENGINES = ("io_uring", "libaio", "psync")


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
