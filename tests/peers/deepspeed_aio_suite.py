#!/usr/bin/env python3
"""Run DeepSpeed's own DeepNVMe (aio/gds) unit tests against nvio.compat.

The test files are not part of nvio: they are DeepSpeed's
``tests/unit/v1/nvme/`` (``tests/unit/ops/aio/`` before DeepSpeed 0.18.x's
move) with the helpers they import (``tests/conftest.py``,
``tests/pytest.ini``, ``tests/unit/{__init__,common,util}.py``). Give a
DeepSpeed checkout's ``tests`` directory, or ``--git`` a clone (or bare
mirror) of deepspeedai/DeepSpeed and ``--rev`` (default HEAD; use the tag
of the installed deepspeed). They run unmodified; what changes is set up
before pytest collects them, in this process and in every process the
tests' ``DistributedTest`` launches (its forkserver and spawned children
run this file's top level again as ``__mp_main__``):

- the import swap: ``AsyncIOBuilder``, ``GDSBuilder`` and
  ``PinMemoryBuilder`` in ``deepspeed.ops.op_builder`` are
  nvio.compat's, and so are ``FastFileWriter``/``FastFileWriterConfig`` in
  ``deepspeed.io``;
- DeepSpeed's compatibility table (``deepspeed.ops.__compatible_ops__``,
  which every file checks at import to skip itself) says what nvio's
  builders say for those ops: nvio's op, not DeepSpeed's, is the one run.

DeepSpeed's accelerator is the CPU one (``DS_ACCELERATOR=cpu``, set unless
given): the tests that need CUDA-pinned tensors or a GPU skip themselves, as
they do in DeepSpeed's own CPU runs. ``pytest.ini``'s ``-m "not
sequential ..."`` is overridden with ``-m ""`` (no marker filter): the
sequential tests (TestAsyncQueue) only must not run in parallel, and this
runs one at a time.

nvio is the one in this source tree's ``python/`` (an in-place build),
put first on sys.path and PYTHONPATH; its path is printed.

    python3 tests/peers/deepspeed_aio_suite.py DS_TESTS_DIR [--real] [-- PYTEST ARGS]
    python3 tests/peers/deepspeed_aio_suite.py --git DS_GIT_DIR [--rev REV] [--real] [-- PYTEST ARGS]

``--real`` makes no swap: DeepSpeed's own op (its async_io must already be
installed or JIT-built in the torch extensions cache, or it is built now),
the reference count on the same machine.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
#: Set by main() for this process and the processes the tests launch.
MODE_VAR = "NVIO_DSAIO_SUITE"
#: The test directories, newest layout first (relative to DeepSpeed's tests/).
TEST_DIRS = ["unit/v1/nvme", "unit/ops/aio"]
FILES = ["test_aio.py", "test_gds.py", "test_pinned_manager.py", "test_aio_gil.py",
         "test_fast_file_writer_fd_close.py"]
#: What the tests import besides the files themselves.
HELPERS = ["conftest.py", "pytest.ini", "unit/__init__.py", "unit/common.py", "unit/util.py"]
#: (module, name) -> nvio.compat's name.
SWAPS = [("deepspeed.ops.op_builder", "AsyncIOBuilder"),
         ("deepspeed.ops.op_builder", "GDSBuilder"),
         ("deepspeed.ops.op_builder", "PinMemoryBuilder"),
         ("deepspeed.io", "FastFileWriter"),
         ("deepspeed.io", "FastFileWriterConfig")]


def import_nvio():
    """This tree's nvio, never a pip-installed one."""
    if sys.path[:1] != [PYTHON]:
        sys.path.insert(0, PYTHON)
    import nvio
    if os.path.dirname(os.path.dirname(os.path.abspath(nvio.__file__))) != PYTHON:
        raise SystemExit("deepspeed_aio_suite: nvio imported from %s, not from %s"
                         % (nvio.__file__, PYTHON))
    return nvio


def swap():
    """nvio.compat's builders and writers where the tests import DeepSpeed's."""
    import_nvio()
    import importlib

    import torch  # noqa: F401  (GDSBuilder.is_compatible asks torch.cuda)

    import deepspeed.ops
    import nvio.compat
    for modname, name in SWAPS:
        setattr(importlib.import_module(modname), name, getattr(nvio.compat, name))
    for name in ("AsyncIOBuilder", "GDSBuilder", "PinMemoryBuilder"):
        builder = getattr(nvio.compat, name)
        deepspeed.ops.__compatible_ops__[builder.NAME] = builder().is_compatible()


def setup():
    mode = os.environ.get(MODE_VAR)
    if mode == "nvio":
        swap()


setup()     # at import: in the launched processes too


def _source(args):
    """(read(relpath) -> bytes or None, description) for DeepSpeed's tests/."""
    import subprocess
    if args.git:
        def read(rel):
            r = subprocess.run(["git", "--git-dir", args.git, "show",
                                "%s:tests/%s" % (args.rev, rel)],
                               capture_output=True, check=False)
            return r.stdout if r.returncode == 0 else None
        return read, "%s at %s" % (args.git, args.rev)

    def read(rel):
        path = os.path.join(os.path.abspath(args.tests_dir), rel)
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            return f.read()
    return read, args.tests_dir


class _Counts:
    """A pytest plugin counting outcomes per test (setup skips included)."""

    def __init__(self):
        self.counts = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and not report.passed):
            key = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
            self.counts[key] = self.counts.get(key, 0) + 1

    def pytest_collectreport(self, report):
        if report.failed:
            self.counts["collection errors"] = self.counts.get("collection errors", 0) + 1
        elif report.skipped:    # a module-level skip (op not compatible)
            self.counts["skipped modules"] = self.counts.get("skipped modules", 0) + 1


def main(argv=None):
    import argparse
    import shutil
    import tempfile
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests_dir", nargs="?", help="DeepSpeed's tests/ directory")
    ap.add_argument("--git", help="a git directory of deepspeedai/DeepSpeed to take them from")
    ap.add_argument("--rev", default="HEAD", help="the revision for --git (default HEAD)")
    ap.add_argument("--real", action="store_true",
                    help="DeepSpeed's own op, no swap (the reference count)")
    argv = sys.argv[1:] if argv is None else list(argv)
    # what follows "--" is pytest's (argparse would give its first word to tests_dir)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.pytest_args = extra
    if (args.tests_dir is None) == (args.git is None):
        ap.error("give DeepSpeed's tests directory or --git, not both")
    read, where = _source(args)

    work = tempfile.mkdtemp(prefix="nvio-dsaio-suite-")
    try:
        dst = os.path.join(work, "tests")
        for rel in HELPERS:
            text = read(rel)
            if text is None:
                ap.error("%s lacks tests/%s" % (where, rel))
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            with open(os.path.join(dst, rel), "wb") as out:
                out.write(text)
        paths = []
        for d in TEST_DIRS:
            for f in FILES:
                text = read("%s/%s" % (d, f))
                if text is None:
                    continue
                os.makedirs(os.path.join(dst, d), exist_ok=True)
                with open(os.path.join(dst, d, f), "wb") as out:
                    out.write(text)
                paths.append(os.path.join(dst, d, f))
            if paths:
                break
        if not any(p.endswith("/test_aio.py") for p in paths):
            ap.error("%s lacks test_aio.py in tests/%s" % (where, " or tests/".join(TEST_DIRS)))

        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ[MODE_VAR] = "real" if args.real else "nvio"
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [PYTHON] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        setup()
        import deepspeed
        import deepspeed.ops.op_builder as op_builder
        from deepspeed.accelerator import get_accelerator
        nvio = import_nvio()
        print("deepspeed_aio_suite: %s (%s); deepspeed %s, accelerator %s; nvio %s"
              % (where, ", ".join(os.path.basename(p) for p in paths), deepspeed.__version__,
                 get_accelerator().device_name(), nvio.__file__))
        print("deepspeed_aio_suite: AsyncIOBuilder is %s.%s"
              % (op_builder.AsyncIOBuilder.__module__, op_builder.AsyncIOBuilder.__qualname__))
        os.chdir(work)
        import pytest
        counts = _Counts()
        # --basetemp: the tests' tmpdirs under work, so that pytest's cleanup
        # of old temporary directories never touches other runs' in /tmp
        rc = pytest.main(["-p", "no:cacheprovider", "-q", "-rfEs", "-m", "",
                          "--rootdir", dst, "--basetemp", os.path.join(work, "tmp"),
                          *paths, *args.pytest_args], plugins=[counts])
        print("deepspeed_aio_suite (%s): %s" % (
            "DeepSpeed's own op" if args.real else "nvio.compat",
            ", ".join("%d %s" % (n, k) for k, n in sorted(counts.counts.items())) or "nothing ran"))
        return rc
    finally:
        os.chdir("/")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
