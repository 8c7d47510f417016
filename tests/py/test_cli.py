"""Tests of the nvio command (build/nvio): report, bench, tune, bad input.

Each test runs the tool as a subprocess on a temporary directory and checks
what it prints (JSON parsed, numbers positive), its exit status and that it
leaves no temporary file behind. Skipped when build/nvio has not been built.
"""
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NVIO = ROOT / "build" / "nvio"

pytestmark = pytest.mark.skipif(not NVIO.exists(),
                                reason="build/nvio not built (run make)")

# Small, quick transfers: correctness, not speed, is checked here.
SMALL = ["--size", "8M", "--loops", "2", "--warmup", "0", "-q"]


@pytest.fixture
def env(tmp_path):
    """The environment of every run: a private tuned-entry file."""
    e = dict(os.environ)
    e["NVIO_TUNED_FILE"] = str(tmp_path / "conf" / "tuned.conf")
    for k in ("NVIO_NO_TUNED", "NVIO_ENGINE", "NVIO_DIRECT"):
        e.pop(k, None)
    return e


@pytest.fixture
def work(tmp_path):
    d = tmp_path / "work"
    d.mkdir()
    return d


def run(args, env, timeout=120):
    return subprocess.run([str(NVIO)] + [str(a) for a in args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_json(args, env, timeout=120):
    p = run(list(args) + ["--json"], env, timeout)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def assert_empty(d):
    left = sorted(os.listdir(d))
    assert left == [], "temporary files left behind: %s" % left


def is_root():
    return os.geteuid() == 0


# ---- help and version ----

@pytest.mark.parametrize("cmd", ["report", "bench", "tune", "clean"])
def test_help_of_each_subcommand(cmd, env):
    p = run([cmd, "--help"], env)
    assert p.returncode == 0
    assert p.stdout.startswith("Usage: nvio %s" % cmd)
    assert p.stderr == ""


def test_top_level_help_and_version(env):
    p = run(["--help"], env)
    assert p.returncode == 0
    for cmd in ("report", "bench", "tune", "clean"):
        assert cmd in p.stdout
    p = run(["--version"], env)
    assert p.returncode == 0 and p.stdout.startswith("nvio ")
    assert run([], env).returncode == 2


def test_bench_help_lists_handle_options(env):
    out = run(["bench", "--help"], env).stdout
    for opt in ("--block-size", "--queue-depth", "--parallelism",
                "--single-submit", "--overlap-events", "--engine",
                "--direct", "--mem", "--compare", "--loops", "--warmup"):
        assert opt in out


# ---- report ----

def test_report_json(work, env):
    r = run_json(["report", work], env)
    assert r["dir"] == str(work)
    assert set(r["engines"]) == {"io_uring", "libaio", "psync"}
    assert r["engines"]["psync"]["available"] is True
    for e in r["engines"].values():
        assert isinstance(e["available"], bool)
        assert e["available"] or e["fix"]
    assert r["default_handle"]["engine"] in r["engines"]
    assert r["fs"]["free_bytes"] > 0 and r["fs"]["type"]
    assert isinstance(r["direct"]["ok"], bool)
    if r["direct"]["ok"]:
        assert r["direct"]["offset_align"] > 0
    else:
        assert r["direct"]["fix"]
    assert "memlock" in r and "meaning" in r["memlock"]
    assert isinstance(r["cuda"]["found"], bool)
    assert r["cuda"]["found"] or r["cuda"]["fix"]
    assert r["cufile"]["mode"] in ("none", "direct", "compat", "unknown")
    assert r["tuned"]["file"] == env["NVIO_TUNED_FILE"]


def test_report_text(work, env):
    p = run(["report", work], env)
    assert p.returncode == 0, p.stderr
    for word in ("io_uring", "libaio", "psync", "O_DIRECT",
                 "RLIMIT_MEMLOCK", "CUDA", "cuFile"):
        assert word in p.stdout


def test_report_default_dir_is_tmpdir(work, env):
    env["TMPDIR"] = str(work)
    assert run_json(["report"], env)["dir"] == str(work)


# ---- bench ----

def check_stats(series):
    g = series["gbps"]
    assert 0 < g["min"] <= g["median"] <= g["max"]
    lat = series["latency_s"]
    assert 0 < lat["min"] <= lat["median"] <= lat["max"]
    assert series["cpu_s_per_gb"] >= 0
    assert len(series["rounds"]) == 2
    assert series["config"]["block_size"] > 0


def test_bench_json_both_directions(work, env):
    r = run_json(["bench", "--dir", work] + SMALL, env)
    assert r["size"] == 8 << 20 and r["dirs"] == [str(work)]
    assert r["gb_bytes"] == 1e9
    assert r["cold_reads"] in ("o_direct", "drop_caches", "none")
    check_stats(r["write"])
    check_stats(r["read"])
    assert_empty(work)


def test_bench_text_states_units(work, env):
    p = run(["bench", "--dir", work] + SMALL, env)
    assert p.returncode == 0, p.stderr
    assert "10^9" in p.stdout and "write" in p.stdout and "read" in p.stdout
    assert "fsync" in p.stdout and "cold reads" in p.stdout
    assert_empty(work)


@pytest.mark.parametrize("only", ["--read", "--write"])
def test_bench_one_direction(only, work, env):
    r = run_json(["bench", "--dir", work, only] + SMALL, env)
    want = only[2:]
    other = "write" if want == "read" else "read"
    check_stats(r[want])
    assert other not in r
    assert_empty(work)


def test_bench_striped_over_dirs(tmp_path, env):
    dirs = [tmp_path / ("d%d" % i) for i in range(3)]
    for d in dirs:
        d.mkdir()
    args = ["bench"] + sum([["--dir", d] for d in dirs], []) + SMALL
    r = run_json(args, env)
    assert r["dirs"] == [str(d) for d in dirs]
    check_stats(r["write"])
    check_stats(r["read"])
    for d in dirs:
        assert_empty(d)


def test_bench_pageable_and_handle_flags(work, env):
    r = run_json(["bench", "--dir", work, "--mem", "pageable",
                  "--block-size", "256K", "--queue-depth", "8",
                  "--parallelism", "2", "--single-submit",
                  "--no-overlap-events", "--engine", "psync"] + SMALL, env)
    assert r["mem"] == "pageable"
    c = r["write"]["config"]
    assert c == {"block_size": 256 << 10, "queue_depth": 8,
                 "intra_op_parallelism": 2, "single_submit": True,
                 "overlap_events": False, "engine": "psync",
                 "direct": "auto"}
    check_stats(r["read"])
    assert_empty(work)


def test_bench_direct_off_keeps_reads_cold_or_says_so(work, env):
    r = run_json(["bench", "--dir", work, "--direct", "off"] + SMALL, env)
    want = "drop_caches" if is_root() else ("drop_caches", "none")
    assert r["cold_reads"] in want
    assert r["write"]["config"]["direct"] == "off"


@pytest.mark.skipif(not shutil.which("fio"), reason="fio not installed")
def test_bench_compare_fio(work, env):
    r = run_json(["bench", "--dir", work, "--compare", "fio"] + SMALL, env,
                 timeout=300)
    assert r["fio"]["version"].startswith("fio-")
    for op in ("write", "read"):
        f = r[op]["fio"]
        assert f["gbps_median"] > 0 and f["ratio_median"] > 0
        assert f["cpu_s_per_gb"] >= 0
        assert len(f["rounds"]) == 2
        assert "iodepth=" in f["best_job"]
    assert_empty(work)


def test_bench_gpu_without_a_driver_fails_clearly(work, env):
    """(test_cli_gpu.py runs --gpu and --gds against the simulated driver.)"""
    if any(os.path.exists(os.path.join(d, "libcuda.so.1"))
           for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")):
        pytest.skip("this machine has a CUDA driver")
    env["NVIO_CUDA_LIB"] = str(work / "no-such-libcuda.so.1")
    p = run(["bench", "--dir", work, "--gpu"] + SMALL, env)
    assert p.returncode == 1, p.stderr
    assert "nvio_cuda_alloc" in p.stderr and "No such device" in p.stderr
    assert_empty(work)


# ---- tune ----

def tune(work, env, *extra):
    return run_json(["tune", "--dir", work, "--size", "16M",
                     "--time-budget", "8", "--repeat", "1", "-q"] +
                    list(extra), env, timeout=300)


def check_aio_block(block):
    aio = block["aio"]
    assert set(aio) == {"block_size", "queue_depth", "intra_op_parallelism",
                        "single_submit", "overlap_events"}
    for k in ("block_size", "queue_depth", "intra_op_parallelism"):
        assert type(aio[k]) is int and aio[k] > 0
    for k in ("single_submit", "overlap_events"):
        assert type(aio[k]) is bool


def test_tune_json_plot_and_save(work, env, tmp_path):
    svg = tmp_path / "tune.svg"
    t0 = time.time()
    r = tune(work, env, "--plot", svg)
    assert time.time() - t0 < 120
    for op in ("write", "read"):
        assert r[op]["gbps"] > 0 and r[op]["default_gbps"] > 0
        assert r[op]["nvio"]["engine"] in ("io_uring", "libaio", "psync")
        check_aio_block(r[op]["deepspeed"])
    check_aio_block(r["deepspeed"])
    steps = {p["step"] for p in r["explored"]}
    assert {"default", "block size", "queue depth"} <= steps
    assert all(p["gbps"] > 0 for p in r["explored"])
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert len(root.findall(".//{http://www.w3.org/2000/svg}rect")) > 5
    assert r["saved"] == env["NVIO_TUNED_FILE"]
    text = Path(r["saved"]).read_text()
    assert "read %s " % os.path.realpath(work) in text
    assert "write %s " % os.path.realpath(work) in text
    assert_empty(work)


def test_tune_text_prints_json_blocks(work, env):
    p = run(["tune", "--dir", work, "--size", "8M", "--time-budget", "3",
             "--repeat", "1", "--write-only", "--no-save", "-q"], env,
            timeout=300)
    assert p.returncode == 0, p.stderr
    body = p.stdout[p.stdout.index("\n{") + 1:]
    r = json.loads(body)
    check_aio_block(r["deepspeed"])
    assert "write" in r and "read" not in r
    assert not os.path.exists(env["NVIO_TUNED_FILE"])
    assert_empty(work)


def test_tuned_entry_is_picked_up_by_bench(work, env):
    r = tune(work, env, "--read-only")
    best = r["read"]["nvio"]
    b = run_json(["bench", "--dir", work, "--read"] + SMALL, env)
    assert b["read"]["tuned"] is True
    for k in ("block_size", "queue_depth", "intra_op_parallelism",
              "single_submit", "overlap_events", "engine"):
        assert b["read"]["config"][k] == best[k]
    p = run(["bench", "--dir", work, "--read"] + SMALL, env)
    assert "tuned entry" in p.stdout
    # ways to ignore it
    env2 = dict(env, NVIO_NO_TUNED="1")
    assert run_json(["bench", "--dir", work, "--read"] + SMALL,
                    env2)["read"]["tuned"] is False
    assert run_json(["bench", "--dir", work, "--read", "--no-tuned"] + SMALL,
                    env)["read"]["tuned"] is False
    # an explicit handle flag wins over the entry
    assert run_json(["bench", "--dir", work, "--read", "--queue-depth", "3"]
                    + SMALL, env)["read"]["tuned"] is False


def test_tuned_entries_of_two_dirs_coexist(tmp_path, env):
    a, b = tmp_path / "a b", tmp_path / "c"
    a.mkdir()
    b.mkdir()
    tune(a, env, "--write-only", "--time-budget", "2")
    tune(b, env, "--write-only", "--time-budget", "2")
    tune(a, env, "--write-only", "--time-budget", "2")
    lines = [l for l in Path(env["NVIO_TUNED_FILE"]).read_text().splitlines()
             if not l.startswith("#")]
    assert len(lines) == 2
    assert any("a%20b" in l for l in lines)
    assert run_json(["report", a], env)["tuned"]["write"] is not None
    assert run_json(["report", a], env)["tuned"]["read"] is None


# ---- bad input ----

BAD_USAGE = [
    (["bench", "--bogus"], "unknown option '--bogus'"),
    (["bench", "--size", "12Q"], "--size 12Q"),
    (["bench", "--size"], "needs a value"),
    (["bench", "--loops", "0"], "--loops 0"),
    (["bench", "--engine", "nope"], "--engine nope"),
    (["bench", "--mem", "huge"], "--mem huge"),
    (["bench", "--compare", "iozone"], "--compare iozone"),
    (["bench", "stray"], "unexpected argument"),
    (["tune", "--read-only", "--write-only"], "exclude each other"),
    (["tune", "--time-budget", "soon"], "--time-budget soon"),
    (["report", "--frobnicate"], "unknown option"),
    (["explode"], "unknown command"),
]


@pytest.mark.parametrize("args,text", BAD_USAGE)
def test_usage_errors(args, text, env):
    p = run(args, env)
    assert p.returncode == 2
    assert text in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert p.stdout == ""


@pytest.mark.parametrize("cmd", ["bench", "tune", "report"])
def test_missing_dir(cmd, env):
    p = run([cmd, "--dir", "/nonexistent/nvio"], env)
    assert p.returncode == 2
    assert p.stderr.strip() == ("nvio %s: --dir /nonexistent/nvio: "
                                "No such file or directory" % cmd)


def test_dir_is_a_file(tmp_path, env):
    f = tmp_path / "f"
    f.write_text("x")
    p = run(["bench", "--dir", f], env)
    assert p.returncode == 2 and "Not a directory" in p.stderr


def test_size_too_big_for_memory(work, env):
    p = run(["bench", "--dir", work, "--size", "1000T"], env)
    assert p.returncode == 1
    assert "memory" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert_empty(work)


def test_read_only_dir(tmpfs, env):
    d = tmpfs("ro", "ro,size=4m")
    for cmd in ("bench", "tune"):
        p = run([cmd, "--dir", d, "--size", "1M"], env)
        assert p.returncode == 1
        assert "Read-only file system" in p.stderr


def test_no_space_is_refused_before_writing(tmpfs, env):
    d = tmpfs("small", "size=4m")
    p = run(["bench", "--dir", d, "--size", "16M"], env)
    assert p.returncode == 1
    assert "No space left on device" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert_empty(d)


def test_no_space_when_dirs_share_a_file_system(tmpfs, env):
    d = tmpfs("small2", "size=6m")
    (d / "x").mkdir()
    (d / "y").mkdir()
    p = run(["bench", "--dir", d / "x", "--dir", d / "y", "--size", "8M"],
            env)
    assert p.returncode == 1 and "No space left" in p.stderr
    assert_empty(d / "x")
    assert_empty(d / "y")


def files_open_in(pid, d):
    """The files (unnamed ones included) process pid has open in d."""
    out = []
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                t = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if t.startswith(str(d) + "/"):
                out.append(t)
    except OSError:
        pass
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_removes_temporary_files(sig, work, env):
    p = subprocess.Popen([str(NVIO), "bench", "--dir", str(work), "--size",
                          "64M", "--loops", "10000", "-q"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.time() + 30
    while not files_open_in(p.pid, work) and time.time() < deadline:
        time.sleep(0.05)
    assert files_open_in(p.pid, work), "bench never created its file"
    time.sleep(0.3)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -sig
    assert "interrupted" in err
    assert_empty(work)


# ---- hostile and unlucky conditions (issue 16) ----

def run_to(args, env, stdout, timeout=120):
    return subprocess.run([str(NVIO)] + [str(a) for a in args], env=env,
                          stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args", [
    ["report", "--json"], ["report"], ["--version"], ["--help"],
    ["bench", "--help"], ["tune", "--help"], ["clean", "--help"], ["clean", "--dry-run"],
    ["bench", "--size", "1M", "--loops", "1", "--warmup", "0", "-q"],
    ["bench", "--size", "1M", "--loops", "1", "--warmup", "0", "-q",
     "--json"],
    ["tune", "--size", "1M", "--time-budget", "1", "--repeat", "1",
     "--write-only", "--no-save", "-q"],
], ids=lambda a: " ".join(a[:2]))
def test_write_error_on_stdout_fails(args, work, env):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    if args[0] in ("bench", "tune") and "--help" not in args:
        args = args + ["--dir", work]
    if args[0] == "clean" and "--help" not in args:
        args = args + [work]
    with open("/dev/full", "w") as full:
        p = run_to(args, env, full)
    assert p.returncode == 1, p.stderr
    assert "writing standard output: No space left on device" in p.stderr
    assert_empty(work)


def tune_args(work, *extra):
    return ["tune", "--dir", work, "--size", "4M", "--time-budget", "2",
            "--repeat", "1", "-q"] + list(extra)


def test_tune_budget_ends_before_any_step(work, env):
    """The budget runs out after the untimed defaults: partial results, no
    crash (it divided by a block size of 0), no test file left."""
    p = run(["tune", "--dir", work, "--size", "16M", "--time-budget",
             "0.001", "--repeat", "1", "-q", "--json"], env)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["budget_reached"] is True
    for op in ("write", "read"):
        assert r[op]["tuned"] is False and r[op]["default_gbps"] > 0
        assert "time-budget" in r[op]["stopped"]
    assert r["deepspeed"] is None and r["saved"] is None
    p = run(["tune", "--dir", work, "--size", "16M", "--time-budget",
             "0.001", "--repeat", "1", "-q"], env)
    assert p.returncode == 0, p.stderr
    assert "not tuned: --time-budget ran out" in p.stdout
    assert "stopped by --time-budget" in p.stdout
    assert_empty(work)


@pytest.mark.parametrize("cmd", ["tune", "bench"])
def test_bad_engine_in_environment_is_named(cmd, work, env):
    env["NVIO_ENGINE"] = "foo"
    p = run([cmd, "--dir", work, "--size", "4M", "-q"], env)
    assert p.returncode == 1, p.stderr
    assert "NVIO_ENGINE=foo" in p.stderr and "unset NVIO_ENGINE" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert_empty(work)


def seccomp_block_io_uring():
    """preexec_fn: io_uring_setup fails with EPERM, as under docker's
    default seccomp profile."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    # ld [nr]; jeq 425 (io_uring_setup) ? errno(EPERM) : allow
    insns = [(0x20, 0, 0, 0), (0x15, 0, 1, 425),
             (0x06, 0, 0, 0x00050000 | 1), (0x06, 0, 0, 0x7fff0000)]
    buf = b"".join(struct.pack("HBBI", *i) for i in insns)
    filt = ctypes.create_string_buffer(buf)
    prog = struct.pack("HxxxxxxP", len(insns), ctypes.addressof(filt))
    prog_buf = ctypes.create_string_buffer(prog)
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, prog_buf, 0, 0):
        os._exit(99)


def run_seccomp(args, env):
    if not sys.platform.startswith("linux"):
        pytest.skip("seccomp is Linux only")
    p = subprocess.run([str(NVIO)] + [str(a) for a in args], env=env,
                       capture_output=True, text=True, timeout=120,
                       preexec_fn=seccomp_block_io_uring)
    if p.returncode == 99:
        pytest.skip("cannot install a seccomp filter here")
    return p


def test_io_uring_forced_but_blocked_by_seccomp(work, env):
    env["NVIO_ENGINE"] = "io_uring"
    p = run_seccomp(tune_args(work), env)
    assert p.returncode == 1, p.stderr
    assert "set by NVIO_ENGINE" in p.stderr, p.stderr
    assert "unset NVIO_ENGINE" in p.stderr
    assert_empty(work)


def test_tune_prints_results_before_a_saving_error(work, env, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    env["NVIO_TUNED_FILE"] = str(blocker / "tuned.conf")  # parent a file
    p = run(tune_args(work, "--write-only", "--json"), env)
    assert p.returncode == 1
    r = json.loads(p.stdout)
    assert r["write"]["gbps"] > 0 and r["saved"] is None
    assert r["save_error"]
    assert "not saved" in p.stderr and str(blocker) in p.stderr
    assert "--no-save" in p.stderr
    p = run(tune_args(work, "--write-only"), env)
    assert p.returncode == 1 and "write best" in p.stdout
    assert_empty(work)


def test_tuned_entry_saves_auto_not_the_engine_auto_picked(work, env):
    r = run_json(tune_args(work, "--write-only"), env)
    auto = run_json(["report", work], env)["default_handle"]["engine"]
    line = [l for l in Path(r["saved"]).read_text().splitlines()
            if l.startswith("write ")][0]
    won = r["write"]["nvio"]["engine"]
    want = "auto" if won == auto else won
    assert line.endswith(" engine=%s" % want), (line, auto)


def test_corrupt_tuned_file_is_named(work, env):
    Path(env["NVIO_TUNED_FILE"]).parent.mkdir()
    Path(env["NVIO_TUNED_FILE"]).write_text(
        "read %s engine=bogus\n" % os.path.realpath(work))
    p = run(["bench", "--dir", work, "--read"] + SMALL, env)
    assert p.returncode == 0, p.stderr
    assert env["NVIO_TUNED_FILE"] in p.stderr
    assert "NVIO_NO_TUNED=1" in p.stderr


PLANT_CASES = [
    ("bench", ["bench", "--size", "4M", "--loops", "1", "--warmup", "0",
               "-q"], ["bench"]),
    ("tune", ["tune", "--size", "4M", "--time-budget", "1", "--repeat", "1",
              "--no-save", "-q"], ["tune"]),
    ("fio", ["bench", "--size", "4M", "--loops", "1", "--warmup", "0", "-q",
             "--compare", "fio"], ["bench"]),
]


@pytest.mark.parametrize("name,args,tags", PLANT_CASES,
                         ids=[c[0] for c in PLANT_CASES])
def test_planted_symlinks_are_not_followed(name, args, tags, tmp_path, env):
    """Another user plants symlinks in the shared directory at every name
    the tool has used (they held its pid): the file they point at must
    stay untouched. The tool is started through a shell that waits, so
    its pid is known before it runs."""
    if name == "fio" and not shutil.which("fio"):
        pytest.skip("fio not installed")
    shared = tmp_path / "shared"
    shared.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    env["TMPDIR"] = str(shared)
    p = subprocess.Popen(["sh", "-c", 'read go; exec "$@"', "sh", str(NVIO)]
                         + args + ["--dir", str(shared)], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    planted = []
    for tag in tags:
        for i in range(4):
            planted.append(shared / (".nvio-%s-%d-%d.tmp" % (tag, p.pid, i)))
    for kind in ("lat", "clat", "slat"):
        for job in range(1, 9):
            planted.append(shared / ("nvio-fio-%d_%s.%d.log" %
                                     (p.pid, kind, job)))
    for link in planted:
        link.symlink_to(victim)
    _, err = p.communicate("go\n", timeout=300)
    assert p.returncode == 0, err
    assert victim.read_bytes() == b"precious"
    for link in planted:
        assert link.is_symlink()
        link.unlink()
    assert_empty(shared)


def test_plot_file_untouched_when_tune_fails(work, env, tmp_path):
    svg = tmp_path / "mine.svg"
    svg.write_text("the user's own file")
    p = run(["tune", "--dir", tmp_path / "missing", "--plot", svg], env)
    assert p.returncode == 2
    assert svg.read_text() == "the user's own file"
    env["NVIO_ENGINE"] = "foo"  # fails after the plot was opened
    p = run(tune_args(work, "--plot", svg), env)
    assert p.returncode == 1
    assert svg.read_text() == "the user's own file"
    assert sorted(os.listdir(tmp_path)) == ["conf", "mine.svg", "work"] or \
        sorted(os.listdir(tmp_path)) == ["mine.svg", "work"]
    assert_empty(work)


def test_plot_replaces_file_only_on_success(work, env, tmp_path):
    svg = tmp_path / "mine.svg"
    svg.write_text("old")
    r = run_json(tune_args(work, "--write-only", "--no-save", "--plot", svg),
                 env)
    assert r["write"]["tuned"]
    assert ET.parse(svg).getroot().tag.endswith("svg")
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".nvio")]


def test_plot_to_a_device_keeps_the_device(env, tmp_path):
    """--plot /dev/null must not unlink it: checked on a null device of
    our own, so a regression cannot remove the system's."""
    if not is_root():
        pytest.skip("mknod needs root")
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    p = run(["tune", "--dir", tmp_path / "missing", "--plot", null], env)
    assert p.returncode == 2
    assert stat.S_ISCHR(os.stat(null).st_mode)


def test_report_on_tmpfs_says_page_cache_only(tmpfs, env):
    d = tmpfs("mem", "size=8m")
    p = run(["report", d], env)
    assert p.returncode == 0, p.stderr
    assert "aligned to 0 bytes" not in p.stdout
    assert "page cache only" in p.stdout
    assert run_json(["report", d], env)["direct"]["bypasses_page_cache"] \
        is False


def test_report_read_only_blames_the_mount_not_o_direct(tmpfs, env):
    d = tmpfs("ro2", "ro,size=4m")
    out = run(["report", d], env).stdout
    line = [l for l in out.splitlines() if l.startswith("  O_DIRECT ")][0]
    assert "read-only" in line and "could not create its test file" in line
    assert "refuses O_DIRECT" not in out


def test_report_not_writable_dir(tmp_path, env):
    if not is_root():
        pytest.skip("needs root to run as another user")
    import tempfile
    top = tempfile.mkdtemp(dir="/tmp")  # pytest's tmp_path is root-only
    try:
        os.chmod(top, 0o755)
        d = Path(top) / "locked"
        d.mkdir(mode=0o555)
        env["HOME"] = top
        p = subprocess.run([str(NVIO), "report", str(d)], env=env,
                           capture_output=True, text=True, timeout=60,
                           preexec_fn=lambda: os.setuid(65534))
    finally:
        shutil.rmtree(top)
    assert p.returncode == 0, p.stderr
    line = [l for l in p.stdout.splitlines() if l.startswith("  O_DIRECT ")][0]
    assert "not writable" in line and "could not create" in line
    assert "refuses O_DIRECT" not in p.stdout


def test_report_on_proc(env):
    p = run(["report", "/proc"], env)
    assert p.returncode == 0, p.stderr
    assert "procfs" in p.stdout and "refuses O_DIRECT" not in p.stdout


def test_report_io_uring_blocked_names_sysctl_and_seccomp(work, env):
    p = run_seccomp(["report", work], env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    i = [n for n, l in enumerate(lines) if l.strip().startswith("io_uring")][0]
    assert " NO: " in lines[i]
    assert lines[i].rstrip().endswith("NVIO_ENGINE=libaio")  # not cut
    fix = lines[i + 1]
    assert "kernel.io_uring_disabled" in fix and "seccomp profile" in fix


def test_bench_on_ramfs_warns_instead_of_refusing(tmpfs, env):
    d = tmpfs("ram", "", "ramfs")
    p = run(["bench", "--dir", d] + SMALL, env)
    assert p.returncode == 0, p.stderr
    assert "ramfs reports no size or free space" in p.stderr
    assert "O_DIRECT bypasses the page cache" not in p.stdout
    assert "does not bypass" in p.stdout
    assert_empty(d)


def test_bench_on_tmpfs_does_not_claim_a_bypass(tmpfs, env):
    d = tmpfs("mem2", "size=32m")
    p = run(["bench", "--dir", d] + SMALL, env)
    assert p.returncode == 0, p.stderr
    assert "O_DIRECT bypasses the page cache" not in p.stdout
    assert "does not bypass" in p.stdout
    assert_empty(d)
