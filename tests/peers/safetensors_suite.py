#!/usr/bin/env python3
"""Run huggingface/safetensors' own Python tests against nvio.safetensors.

The test files are not part of nvio: fetch them from the safetensors
repository (``bindings/python/tests`` of the release matching the installed
package) into a directory and give it here. They run unmodified; the only
change is the import swap made before pytest collects them:

    safetensors.torch   -> nvio.safetensors.torch
    safetensors.numpy   -> nvio.safetensors.numpy
    safetensors.safe_open (and safetensors.SafetensorError's users' view of
                        it) -> nvio.safetensors.safe_open

The rest of the ``safetensors`` package (serialize, TensorSpec,
_safe_open_handle) stays the real one: nvio has no counterpart of those
low-level calls. A name a test imports from the swapped modules that nvio
lacks fails that test's collection (nothing falls back to the real package).

    python3 tests/peers/safetensors_suite.py TESTS_DIR [--real] [-- pytest args]

``--real`` runs the same files against the real package (the reference
count). The tests write relative paths (./tests/data/...): they run in a
fresh temporary directory holding a copy of TESTS_DIR as ``tests/``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")

#: The files issue 32 names (the ones that need no other framework).
FILES = ["test_pt_comparison.py", "test_simple.py", "test_pt_model.py",
         "test_pread_backend.py", "test_handle.py", "test_multithreaded.py",
         "test_threadable.py"]


def swap():
    """Put nvio's modules where the tests import safetensors' from."""
    sys.path.insert(0, PYTHON)
    import safetensors
    import safetensors.numpy  # noqa: F401  (loaded first, then replaced)
    import safetensors.torch  # noqa: F401

    import nvio.safetensors
    import nvio.safetensors.numpy
    import nvio.safetensors.torch
    sys.modules["safetensors.torch"] = nvio.safetensors.torch
    sys.modules["safetensors.numpy"] = nvio.safetensors.numpy
    safetensors.torch = nvio.safetensors.torch
    safetensors.numpy = nvio.safetensors.numpy
    safetensors.safe_open = nvio.safetensors.safe_open


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests", help="directory holding safetensors' bindings/python/tests files")
    ap.add_argument("--real", action="store_true", help="run against the real package")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    a = ap.parse_args(argv)
    src = os.path.abspath(a.tests)
    missing = [f for f in FILES if not os.path.isfile(os.path.join(src, f))]
    if missing:
        ap.error("%s lacks %s" % (src, ", ".join(missing)))
    work = tempfile.mkdtemp(prefix="nvio-st-suite-")
    try:
        dst = os.path.join(work, "tests")
        os.makedirs(os.path.join(dst, "data"))
        for f in FILES:
            shutil.copy(os.path.join(src, f), dst)
        init = os.path.join(src, "data", "__init__.py")
        if os.path.isfile(init):
            shutil.copy(init, os.path.join(dst, "data"))
        os.chdir(work)
        if not a.real:
            swap()
        import pytest
        return pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", work,
                            *[os.path.join("tests", f) for f in FILES], *a.pytest_args])
    finally:
        os.chdir("/")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
