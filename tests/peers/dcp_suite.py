#!/usr/bin/env python3
"""Run PyTorch's own DCP file-system tests against nvio.dcp.

The test files are not part of nvio: fetch
``test/distributed/checkpoint/test_file_system_checkpoint_cpu.py`` and
``test_dtensor_resharding.py`` from the pytorch repository (the revision
matching the installed torch) into a directory and give it here. They run
unmodified, on CPU with gloo; what changes is set up before pytest collects
them, in this process and in every rank process the tests spawn (a spawned
child runs this file's top level again as ``__mp_main__``):

- the import swap: ``FileSystemWriter``/``FileSystemReader`` in
  ``torch.distributed.checkpoint`` (and its ``filesystem`` and
  ``_storage_utils`` modules, which ``dcp.save(checkpoint_id=...)`` uses)
  are nvio.dcp's;
- the GPU skips lifted: ``skip_if_lt_x_gpu`` runs its test on CPU-only
  machines (its own ``allow_cpu=True``), and ``Module.cuda`` leaves a module
  where it is when there is no CUDA (one test moves its model with it).

    python3 tests/peers/dcp_suite.py TESTS_DIR [--real] [-- pytest args]

``--real`` makes every change but the swap: the reference count, with
torch's own writer and reader, on the same machine.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
#: Set by main() for this process and the rank processes it spawns.
MODE_VAR = "NVIO_DCP_SUITE"
FILES = ["test_file_system_checkpoint_cpu.py", "test_dtensor_resharding.py"]


def lift_gpu_skips():
    import functools

    import torch
    from torch.testing._internal import common_distributed

    orig = common_distributed.skip_if_lt_x_gpu

    @functools.wraps(orig)
    def skip_if_lt_x_gpu(x, *, allow_cpu=True):
        return orig(x, allow_cpu=allow_cpu)
    common_distributed.skip_if_lt_x_gpu = skip_if_lt_x_gpu
    from torch.testing._internal.distributed._tensor import common_dtensor
    common_dtensor.skip_if_lt_x_gpu = skip_if_lt_x_gpu

    if not torch.cuda.is_available():
        cuda = torch.nn.Module.cuda

        def cpu_only(self, device=None):
            return self
        cpu_only.__wrapped__ = cuda
        torch.nn.Module.cuda = cpu_only


def swap():
    """nvio.dcp's writer and reader wherever the tests and dcp find torch's."""
    if PYTHON not in sys.path:
        sys.path.insert(0, PYTHON)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import _storage_utils, filesystem

    import nvio.dcp
    for mod in (dcp, filesystem, _storage_utils):
        mod.FileSystemWriter = nvio.dcp.FileSystemWriter
        mod.FileSystemReader = nvio.dcp.FileSystemReader


def setup():
    mode = os.environ.get(MODE_VAR)
    if not mode:
        return
    lift_gpu_skips()
    if mode == "nvio":
        swap()


setup()     # at import: in the rank processes too


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests_dir")
    ap.add_argument("--real", action="store_true",
                    help="torch's own writer and reader (the reference count)")
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args(argv)
    paths = [os.path.join(args.tests_dir, f) for f in FILES]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        ap.error("missing: %s (fetch them from pytorch's test/distributed/checkpoint/)"
                 % ", ".join(missing))
    os.environ[MODE_VAR] = "real" if args.real else "nvio"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    setup()
    import torch.distributed.checkpoint as dcp
    print("dcp_suite: FileSystemWriter is %s.%s" % (dcp.FileSystemWriter.__module__,
                                                    dcp.FileSystemWriter.__qualname__))
    import pytest
    return pytest.main(["-p", "no:cacheprovider", "-q", "-rfE"] + paths + args.pytest_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
