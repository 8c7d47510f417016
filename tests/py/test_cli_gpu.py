"""`nvio bench --gpu/--gds` and `nvio tune --gpu/--gds` against the
simulated CUDA driver and cuFile (tests/sim/), found by the tool through
NVIO_CUDA_LIB and NVIO_CUFILE_LIB as on a GPU machine it finds the real
ones. The tool moves simulated device memory, which faults on any host
access: a tool that touched it, or forgot a synchronisation, would crash
or fail its transfers.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

import gpusim

ROOT = Path(__file__).resolve().parents[2]
NVIO = ROOT / "build" / "nvio"

pytestmark = pytest.mark.skipif(not NVIO.exists(),
                                reason="build/nvio not built (run make)")
SMALL = ["--size", "8M", "--loops", "2", "--warmup", "0", "-q"]


@pytest.fixture(scope="module")
def simdir():
    try:
        return gpusim._find()
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
        if os.environ.get("NVIO_TEST_REQUIRE_SIM") == "1":
            pytest.fail(f"CUDA simulator required (NVIO_TEST_REQUIRE_SIM=1): {e}")
        pytest.skip(f"no CUDA simulator: {e}")


@pytest.fixture
def env(tmp_path, simdir):
    e = dict(os.environ)
    e["NVIO_TUNED_FILE"] = str(tmp_path / "conf" / "tuned.conf")
    e["NVIO_CUDA_LIB"] = os.path.join(simdir, "libcuda.so.1")
    e["NVIO_CUFILE_LIB"] = os.path.join(simdir, "libcufile.so.0")
    for k in ("NVIO_NO_TUNED", "NVIO_ENGINE", "NVIO_DIRECT"):
        e.pop(k, None)
    return e


@pytest.fixture
def work(tmp_path):
    d = tmp_path / "work"
    d.mkdir()
    return d


def run_json(args, env):
    p = subprocess.run([str(NVIO)] + [str(a) for a in args] + ["--json"], env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("opt,mem", [("--gpu", "gpu"), ("--gds", "gds"), ("--gpu=1", "gpu")])
def test_bench_device_memory(work, env, opt, mem):
    j = run_json(["bench", "--dir", work, opt] + SMALL, env)
    assert j["mem"] == mem
    for op in ("write", "read"):
        assert j[op]["gbps"]["median"] > 0
    if mem == "gds":
        assert "cuFile" in j["write"]["engine_note"]
    assert os.listdir(work) == []


def test_bench_no_such_device(work, env):
    p = subprocess.run([str(NVIO), "bench", "--dir", str(work), "--gpu=7"] + SMALL,
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert "--gpu 7: nvio_cuda_alloc" in p.stderr
    assert os.listdir(work) == []


@pytest.mark.parametrize("opt", ["--gpu", "--gds"])
def test_tune_device_memory_does_not_save(work, env, opt):
    j = run_json(["tune", "--dir", work, opt, "--size", "4M", "--time-budget", "3",
                  "--repeat", "1", "-q"], env)
    assert j["explored"] and j["write"]["gbps"] > 0 and j["read"]["gbps"] > 0
    assert not j["saved"]       # the tuned file is for host memory
    assert not os.path.exists(env["NVIO_TUNED_FILE"])
    assert os.listdir(work) == []
