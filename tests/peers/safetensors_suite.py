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
    python3 tests/peers/safetensors_suite.py --git SAFETENSORS_GIT_DIR [--rev REV] [--real]

``--git`` takes the files from a clone (or bare mirror) of
huggingface/safetensors at ``--rev`` (default HEAD) instead of a directory.

Measured with safetensors 0.8.0 (PyPI) and the tests at 24b0b2857fef (the
newest snapshot at hand; v0.8.0-rc.0 predates the pread backend that
0.8.0 has): the real package 66 passed, 13 skipped; nvio the same 66.

``--real`` runs the same files against the real package (the reference
count). The tests write relative paths (./tests/data/...): they run in a
fresh temporary directory holding a copy of TESTS_DIR as ``tests/``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")

#: The files issue 32 names (the ones that need no other framework).
FILES = ["test_pt_comparison.py", "test_simple.py", "test_pt_model.py",
         "test_pread_backend.py", "test_handle.py", "test_multithreaded.py",
         "test_threadable.py"]


def _import_nvio():
    """nvio as installed (pip install .), else the source tree's python/
    (an in-place build): never the source tree over an installed nvio,
    whose python/ has no built extension."""
    try:
        import nvio  # noqa: F401
    except ImportError:
        sys.path.insert(0, PYTHON)
        import nvio  # noqa: F401


def swap():
    """Put nvio's modules where the tests import safetensors' from."""
    _import_nvio()
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


def _fetch(a, name):
    """The bytes of one test file, or None where the source has none."""
    if a.git:
        r = subprocess.run(["git", "--git-dir", a.git, "show",
                            "%s:bindings/python/tests/%s" % (a.rev, name)],
                           capture_output=True, check=False)
        return r.stdout if r.returncode == 0 else None
    path = os.path.join(os.path.abspath(a.tests), name)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests", nargs="?",
                    help="directory holding safetensors' bindings/python/tests files")
    ap.add_argument("--git", help="a git directory of huggingface/safetensors to take them from")
    ap.add_argument("--rev", default="HEAD", help="the revision for --git (default HEAD)")
    ap.add_argument("--real", action="store_true", help="run against the real package")
    ap.epilog = "more pytest arguments after --, e.g. -- -k slice"
    argv = list(sys.argv[1:] if argv is None else argv)
    # split by hand: argparse would hand the first word after -- to the
    # optional tests directory (--git X -- -k slice took "-k" for it)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    a.pytest_args = extra
    if (a.tests is None) == (a.git is None):
        ap.error("give a tests directory or --git, not both")
    work = tempfile.mkdtemp(prefix="nvio-st-suite-")
    try:
        dst = os.path.join(work, "tests")
        os.makedirs(os.path.join(dst, "data"))
        for f in FILES + ["data/__init__.py"]:
            text = _fetch(a, f)
            if text is None and f in FILES:
                ap.error("%s lacks %s" % (a.git or a.tests, f))
            if text is not None:
                with open(os.path.join(dst, f), "wb") as out:
                    out.write(text)
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
