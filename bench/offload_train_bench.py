#!/usr/bin/env python3
"""bench/offload_train_bench.py - issue 20's benchmark on a real transformer:
a Llama built from a config (transformers.LlamaForCausalLM, random fp32
weights), trained with its optimizer state, parameters and gradients on NVMe
(nvio.offload.offload_model + NVMeOptimizer), against the same model in
memory, on the real disk and the RAM disk (bench/ramdisk.sh).

Two parts, each a pair of worker processes driven in interleaved rounds
(in-memory step, NVMe step, fio write, fio read):

  optimizer  the model and its gradients in memory (one backward's), AdamW's
             state in memory vs on NVMe (NVMeOptimizer): the timed call is
             opt.step(). I/O bound = state bytes read / fio-best read +
             state bytes written / fio-best write (8 B per parameter each
             way). Target (issue 20): NVMe step <= 1.25x the I/O bound.
  train      a whole training step (zero_grad, forward with labels,
             backward, opt.step()) in memory vs with offload_model (weights
             and grads on NVMe between uses) + NVMeOptimizer (state on
             NVMe). The offload traffic is counted at the swappers (bytes
             each read and write op moves); its I/O bound is those bytes
             over fio-best, as above. Losses of every step are compared
             between the two workers: they must be equal.

Both parts check their result: the optimizer part compares a SHA-256 of
every parameter after the last step, the train part the losses of every
step and the parameters' digest at the end ("equal" or "DIFFERENT", and a
DIFFERENT fails the run).

Each worker is its own process, so its peak RSS (VmHWM, reset with
/proc/self/clear_refs after set-up and the warm-up step) is its own; the
NVMe trainer's is set beside its pools (nvio's memory for weights, grads and
state) and the in-memory trainer's.

fio-best: the checkpoint bench's two fio configurations (1 MiB x QD32 x 1
job and 8 MiB x QD128 x 2 jobs, libaio, O_DIRECT, huge-page buffers, caches
dropped first, end_fsync for writes), on a file of --fio-size in the same
directory, in every round.

Needs root (drop_caches, hugetlbfs, the RAM disk), like checkpoint_bench.py.
A RAM disk this script mounts it takes down at the end; one that was
mounted already is left as it is.

  sudo python3 bench/offload_train_bench.py --disk both --rounds 3 \\
      --out bench/results/offload-2026-11-26.md
  # torch's one-pass AdamW, and OpenMP threads that sleep instead of
  # spinning between kernels (see README, "Training ... on NVMe", Speed):
  sudo python3 bench/offload_train_bench.py --disk both --fused \\
      --env OMP_WAIT_POLICY=PASSIVE

Every worker reports each step's wall and CPU seconds (all its threads);
training steps are split into forward, backward and optimizer step, and
the NVMe optimizer's step into waiting for reads, update, waiting for
writes (``NVMeOptimizer.last_step``).

Memory (default model: 8 layers, hidden 1024, vocab 8192, 120 M
parameters, 1.9 GB of fp32 weights + AdamW state): the in-memory workers
hold 16 B per parameter, the NVMe optimizer worker 8 B per parameter (the
model and its grads) plus its pool, the NVMe trainer its pools and the
activations; the RAM disk holds the swap files (up to the 1.9 GB of the
model's weights, grads and state) and the fio file.
"""
import argparse
import contextlib
import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MiB = 1 << 20
FIO_CFGS = [dict(engine="libaio", block=MiB, qd=32, jobs=1, huge=1),
            dict(engine="libaio", block=8 * MiB, qd=128, jobs=2, huge=1)]


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak():
    """VmHWM := VmRSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


# --- the workers ---------------------------------------------------------------

def config(a):
    import transformers
    return transformers.LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.inter,
        num_hidden_layers=a.layers, num_attention_heads=a.hidden // 128,
        num_key_value_heads=a.hidden // 128, max_position_embeddings=max(a.seq, 128),
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def batch(a, i):
    import torch
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)


def units(m):
    """offload_model's units for a LlamaForCausalLM: the embedding, each
    decoder layer, the final norm, the head (LlamaModel is no container, so
    the default would make the whole body one unit)."""
    return [m.model.embed_tokens, *m.model.layers, m.model.norm, m.lm_head]


def count_traffic(sw, tally):
    """Count the bytes every read and write op of swapper sw moves."""
    from nvio import _nvio
    orig = sw._submit

    def submit(ops, done):
        for op in ops:
            tally["read" if op[0] == _nvio.OP_READ else "write"] += op[2].numel()
        return orig(ops, done)
    sw._submit = submit


def digest(params, fetch=None):
    h = hashlib.sha256()
    for p in params:
        t = fetch(p) if fetch is not None else p.detach()
        h.update(t.contiguous().view(-1).numpy().tobytes())
    return h.hexdigest()[:16]


def worker(a):
    import torch
    import transformers
    import warnings
    import nvio
    from nvio.offload import NVMeOptimizer, offload_model
    # the embedding's inputs need no grad: torch says so at every backward
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    out = sys.stdout
    sys.stdout = sys.stderr      # nothing else may write the protocol's stream

    def reply(d):
        out.write(json.dumps(d) + "\n")
        out.flush()
    rss_base = status_kib("VmRSS") * 1024
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(config(a))
    m.train()
    n = sum(p.numel() for p in m.parameters())
    info = {"params": n, "rss_base": rss_base, "kind": a.worker,
            "threads": torch.get_num_threads(), "nvio": nvio.__version__}
    params = list(m.parameters())
    om = opt = None
    tally = {"read": 0, "write": 0}
    pools = 0
    kind = a.worker
    nvme = kind.endswith("nvme")
    x0 = batch(a, 0)
    if kind.startswith("opt"):
        # one backward's gradients, kept: every step steps with them
        m(input_ids=x0, labels=x0).loss.backward()
    if kind == "train-nvme":
        om = offload_model(m, a.dir, prefetch=a.prefetch, units=units(m))
        count_traffic(om.swapper, tally)
        pools += om.swapper.pool_bytes
    base = torch.optim.AdamW(params, lr=1e-4, fused=a.fused or None)
    if nvme:
        opt = NVMeOptimizer(base, a.dir, sub_group_numel=a.sub_group)
        count_traffic(opt.swapper, tally)
        pools += opt.swapper.pool_bytes
        info["sub_groups"] = len(opt._subgroups)
        info["opt_pool"] = opt.swapper.pool_bytes
    else:
        opt = base
    if om is not None:
        info["model_pool"] = om.swapper.pool_bytes
        info["units"] = len(om._units)
    info["pools"] = pools
    step_no = [0]
    cpu = [0.0]          # the last step's CPU seconds, every thread of the process
    split = [0.0, 0.0, 0.0]      # forward, backward, optimizer step (s)

    def step():
        c0 = time.process_time()
        t0 = time.perf_counter()
        if kind.startswith("opt"):
            opt.step()
            loss = None
        else:
            x = batch(a, step_no[0])
            opt.zero_grad()
            loss = m(input_ids=x, labels=x).loss
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            loss = loss.item()
            opt.step()
            split[:] = [t1 - t0, t2 - t1, time.perf_counter() - t2]
        t = time.perf_counter() - t0
        step_no[0] += 1
        cpu[0] = time.process_time() - c0
        return t, loss
    info["rss_ready"] = status_kib("VmRSS") * 1024
    # warm-up (untimed): the state is created (and, for NVMe, written)
    tally["read"] = tally["write"] = 0
    t, loss = step()
    info.update(warmup_s=t, warmup_loss=loss, rss_setup=status_kib("VmRSS") * 1024)
    reset_peak()
    reply(info)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "step":
            tally["read"] = tally["write"] = 0
            t, loss = step()
            r = {"s": t, "cpu_s": cpu[0], "split": list(split), "loss": loss, "read_bytes": tally["read"],
                 "write_bytes": tally["write"]}
            if nvme:
                r.update({"opt_" + k: v for k, v in opt.last_step.items()})
            reply(r)
        elif cmd == "end":
            fin = {"rss_peak": status_kib("VmHWM") * 1024, "rss_now": status_kib("VmRSS") * 1024}
            fin["digest"] = digest(params, om.fetch_param_copy if om is not None else None)
            if nvme:
                opt.close()
            if om is not None:
                om.remove()
            reply(fin)
            return


class Worker:
    def __init__(self, a, kind, d):
        argv = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--dir", d]
        for k in ("layers", "hidden", "inter", "vocab", "seq", "batch", "sub_group", "prefetch"):
            argv += ["--" + k.replace("_", "-"), str(getattr(a, k))]
        if a.fused:
            argv.append("--fused")
        self.kind = kind
        env = dict(os.environ)
        env.update(kv.split("=", 1) for kv in a.env)
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)
        self.info = self.read()

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("worker %s died (exit %s)" % (self.kind, self.p.wait()))
        return json.loads(line)

    def ask(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.read()

    def end(self):
        r = self.ask("end")
        self.p.stdin.close()
        self.p.wait(timeout=120)
        return r


# --- the driver ----------------------------------------------------------------

def fstrim(d):
    subprocess.run(["fstrim", d], capture_output=True)


def fio_best(fio, op, path, size, disk, d):
    best = None
    for c in FIO_CFGS:
        r = fio.run_fio(op, path, size, c)
        if best is None or r["gbps"] > best["gbps"]:
            best = r
    if disk == "ram":
        fstrim(d)
    return best["gbps"]


def run_part(a, part, disk, d, fio):
    log("%s on %s (%s): starting the workers" % (part, disk, d))
    mem = Worker(a, part + "-mem", d)
    log("  %s ready: %s" % (mem.kind, mem.info))
    nv = Worker(a, part + "-nvme", d)
    log("  %s ready: %s" % (nv.kind, nv.info))
    fpath = os.path.join(d, "offload-train-fio.bin")
    rows = []
    try:
        for r in range(a.rounds):
            row = {}
            m = mem.ask("step")
            row["memory_s"], row["memory_loss"] = m["s"], m["loss"]
            v = nv.ask("step")
            row.update(memory_cpu_s=m["cpu_s"], nvme_cpu_s=v["cpu_s"])
            if part == "train":
                row.update(memory_split=m["split"], nvme_split=v["split"])
            row.update(nvme_s=v["s"], nvme_loss=v["loss"], read_bytes=v["read_bytes"],
                       write_bytes=v["write_bytes"])
            row.update({k: v[k] for k in v if k.startswith("opt_")})
            row["fio_write_GBps"] = fio_best(fio, "write", fpath, a.fio_size, disk, d)
            row["fio_read_GBps"] = fio_best(fio, "read", fpath, a.fio_size, disk, d)
            row["load"] = float(open("/proc/loadavg").read().split()[0])
            rows.append(row)
            log("  round %d: %s" % (r, json.dumps(row)))
    finally:
        try:
            os.unlink(fpath)
        except FileNotFoundError:
            pass
    fm, fv = mem.end(), nv.end()
    if disk == "ram":
        fstrim(d)
    return dict(part=part, disk=disk, dir=d, mem=mem.info, nvme=nv.info, rows=rows,
                mem_end=fm, nvme_end=fv)


def gb(x):
    return x / 1e9


def report_part(res, a):
    rows = res["rows"]
    n = res["nvme"]["params"]
    med = lambda f: statistics.median(f(x) for x in rows)  # noqa: E731
    L = []
    part, disk = res["part"], res["disk"]
    if part == "optimizer":
        sb = 8 * n
        bound = lambda x: gb(sb) / x["fio_read_GBps"] + gb(sb) / x["fio_write_GBps"]  # noqa
        counted = med(lambda x: x["read_bytes"]), med(lambda x: x["write_bytes"])
        L += ["### AdamW step, %s disk (%s)" % (disk, res["dir"]), "",
              "State bytes per step: %.2f GB read and %.2f GB written (8 B per parameter each "
              "way; counted at the swapper: %.2f GB read, %.2f GB written); %d sub-groups, "
              "optimizer pool %.0f MiB." % (gb(sb), gb(sb), gb(counted[0]), gb(counted[1]),
                                            res["nvme"]["sub_groups"],
                                            res["nvme"]["opt_pool"] / MiB), "",
              "| | median |", "|---|---|",
              "| step, state in memory (s) | %.3f |" % med(lambda x: x["memory_s"]),
              "| step, state on NVMe (s) | %.3f |" % med(lambda x: x["nvme_s"]),
              "| CPU seconds of the step (all threads): in memory / NVMe | %.2f / %.2f |" % (
                  med(lambda x: x["memory_cpu_s"]), med(lambda x: x["nvme_cpu_s"])),
              "| of which: waiting for reads / compute / waiting for writes (s) | "
              "%.3f / %.3f / %.3f |" % (med(lambda x: x["opt_read_wait"]),
                                        med(lambda x: x["opt_compute"]),
                                        med(lambda x: x["opt_write_wait"])),
              "| I/O bound: state bytes / fio-best read + / fio-best write (s) | %.3f |"
              % med(bound),
              "| fio-best read / write GB/s | %.2f / %.2f |" % (
                  med(lambda x: x["fio_read_GBps"]), med(lambda x: x["fio_write_GBps"])),
              "| offload traffic GB/s: read / write (bytes over the whole step) | %.2f / %.2f |"
              % (med(lambda x: gb(x["read_bytes"]) / x["nvme_s"]),
                 med(lambda x: gb(x["write_bytes"]) / x["nvme_s"])),
              "| **NVMe step / I/O bound** (target <= 1.25) | **%.2f** |"
              % med(lambda x: x["nvme_s"] / bound(x)),
              "| NVMe step / in-memory step | %.2f |" % med(lambda x: x["nvme_s"] / x["memory_s"]),
              "| peak RSS during the steps: in memory / NVMe (GB) | %.2f / %.2f |" % (
                  gb(res["mem_end"]["rss_peak"]), gb(res["nvme_end"]["rss_peak"])),
              ""]
        ok = res["mem_end"]["digest"] == res["nvme_end"]["digest"]
        L.append("Validation: parameters after %d steps (SHA-256 of every parameter's bytes): "
                 "%s (%s / %s)." % (a.rounds + 1, "equal" if ok else "DIFFERENT",
                                    res["mem_end"]["digest"], res["nvme_end"]["digest"]))
    else:
        bound = lambda x: gb(x["read_bytes"]) / x["fio_read_GBps"] + \
            gb(x["write_bytes"]) / x["fio_write_GBps"]  # noqa: E731
        ob = lambda x: gb(16 * n) / x["fio_read_GBps"] + gb(12 * n) / x["fio_write_GBps"]  # noqa
        pools = res["nvme"]["pools"]
        L += ["### Training step, %s disk (%s)" % (disk, res["dir"]), "",
              "offload_model (%d units, prefetch %d, pool %.0f MiB) + NVMeOptimizer(AdamW) "
              "(%d sub-groups, pool %.0f MiB): nvio's pools %.0f MiB in all; the model's fp32 "
              "weights + AdamW state are %.2f GB = **%.1fx the pools**." % (
                  res["nvme"]["units"], a.prefetch, res["nvme"]["model_pool"] / MiB,
                  res["nvme"]["sub_groups"], res["nvme"]["opt_pool"] / MiB, pools / MiB,
                  gb(16 * n), 16 * n / pools), "",
              "| | median |", "|---|---|",
              "| training step in memory (s) | %.3f |" % med(lambda x: x["memory_s"]),
              "| training step, weights + grads + state on NVMe (s) | %.3f |"
              % med(lambda x: x["nvme_s"]),
              "| CPU seconds of the step (all threads): in memory / NVMe | %.2f / %.2f |" % (
                  med(lambda x: x["memory_cpu_s"]), med(lambda x: x["nvme_cpu_s"])),
              "| forward / backward / optimizer step, in memory (s) | %.3f / %.3f / %.3f |" % tuple(
                  med(lambda x, i=i: x["memory_split"][i]) for i in range(3)),
              "| forward / backward / optimizer step, NVMe (s) | %.3f / %.3f / %.3f |" % tuple(
                  med(lambda x, i=i: x["nvme_split"][i]) for i in range(3)),
              "| of which the optimizer step (s): total / waiting for reads / compute / "
              "waiting for writes | %.3f / %.3f / %.3f / %.3f |" % (
                  med(lambda x: x["opt_total"]), med(lambda x: x["opt_read_wait"]),
                  med(lambda x: x["opt_compute"]), med(lambda x: x["opt_write_wait"])),
              "| offload traffic per step: read / written (GB) | %.2f / %.2f |" % (
                  med(lambda x: gb(x["read_bytes"])), med(lambda x: gb(x["write_bytes"]))),
              "| I/O bound of that traffic at fio-best (s) | %.3f |" % med(bound),
              "| fio-best read / write GB/s | %.2f / %.2f |" % (
                  med(lambda x: x["fio_read_GBps"]), med(lambda x: x["fio_write_GBps"])),
              "| offload traffic GB/s over the step: read / write | %.2f / %.2f |" % (
                  med(lambda x: gb(x["read_bytes"]) / x["nvme_s"]),
                  med(lambda x: gb(x["write_bytes"]) / x["nvme_s"])),
              "| ... as a fraction of fio-best: read / write | %.2f / %.2f |" % (
                  med(lambda x: gb(x["read_bytes"]) / x["nvme_s"] / x["fio_read_GBps"]),
                  med(lambda x: gb(x["write_bytes"]) / x["nvme_s"] / x["fio_write_GBps"])),
              "| NVMe training step / its I/O bound | %.2f |"
              % med(lambda x: x["nvme_s"] / bound(x)),
              "| optimizer step within it / its I/O bound (16 B/param read, 12 written) | %.2f |"
              % med(lambda x: x["opt_total"] / ob(x)),
              "| NVMe training step / in-memory training step | %.2f |"
              % med(lambda x: x["nvme_s"] / x["memory_s"]),
              "| peak RSS during the steps: in memory / NVMe (GB) | %.2f / %.2f |" % (
                  gb(res["mem_end"]["rss_peak"]), gb(res["nvme_end"]["rss_peak"])),
              "| NVMe trainer RSS: before the model / model offloaded, pools made / after the "
              "warm-up step (GB) | %.2f / %.2f / %.2f |" % (
                  gb(res["nvme"]["rss_base"]), gb(res["nvme"]["rss_ready"]),
                  gb(res["nvme"]["rss_setup"])),
              ""]
        la = [res["mem"]["warmup_loss"]] + [x["memory_loss"] for x in rows]
        lb = [res["nvme"]["warmup_loss"]] + [x["nvme_loss"] for x in rows]
        ok = la == lb
        okp = res["mem_end"]["digest"] == res["nvme_end"]["digest"]
        L.append("Validation: losses of the %d steps %s (in memory %s; NVMe %s); parameters "
                 "after them (SHA-256): %s." % (
                     len(la), "equal" if ok else "DIFFERENT", ["%.6f" % v for v in la],
                     ["%.6f" % v for v in lb], "equal" if okp else "DIFFERENT"))
        ready = res["nvme"]["rss_ready"]
        L.append("")
        L.append("Memory: the NVMe trainer's peak RSS during the timed steps is %.2f GB: %.2f GB "
                 "were resident once the model was offloaded and the pools made (interpreter, "
                 "torch, transformers %.2f GB before the model existed; nvio's pools %.2f GB, "
                 "locked), and the %.2f GB above that are activations, the gradients of the "
                 "unit backward is in before they are swapped out, and torch's temporaries: "
                 "none of it grows with the number of layers. The in-memory trainer peaks at "
                 "%.2f GB; the model's weights + AdamW state alone are %.2f GB." % (
                     gb(res["nvme_end"]["rss_peak"]), gb(ready), gb(res["nvme"]["rss_base"]),
                     gb(pools), gb(res["nvme_end"]["rss_peak"] - ready),
                     gb(res["mem_end"]["rss_peak"]), gb(16 * n)))
    L += ["", "Raw rounds:", "", "```"] + [json.dumps(x) for x in rows] + [
        json.dumps({"mem": res["mem"], "nvme": res["nvme"]}),
        json.dumps({"mem_end": res["mem_end"], "nvme_end": res["nvme_end"]}), "```", ""]
    ok_all = ok and (part == "optimizer" or okp)
    return L, ok_all


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--disk", choices=("real", "ram", "both"), default="real")
    ap.add_argument("--part", choices=("optimizer", "train", "both"), default="both")
    ap.add_argument("--real-dir", default="/var/tmp/nvio-offload-bench")
    ap.add_argument("--ram-size", default="8G")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--inter", type=int, default=2816)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--sub-group", type=int, default=1 << 23)
    ap.add_argument("--prefetch", type=int, default=1)
    ap.add_argument("--fio-size", type=int, default=1 << 30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="set in both contenders' environment (e.g. OMP_WAIT_POLICY=PASSIVE)")
    ap.add_argument("--fused", action="store_true",
                    help="AdamW(fused=True) in both contenders (torch's one-pass CPU kernel)")
    ap.add_argument("--out")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    if os.geteuid() != 0:
        sys.exit("offload_train_bench.py: needs root (drop_caches, hugetlbfs, the RAM disk)")
    import signal
    signal.signal(signal.SIGTERM, lambda *x: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *x: sys.exit(129))
    sys.path.insert(0, HERE)
    import core_bench
    import guestmem
    import hugepages
    import ramdisk
    import torch
    import nvio
    fio = core_bench.Bench.__new__(core_bench.Bench)
    fio.args = argparse.Namespace(quick=False)
    fio.log = log
    disks = [k for k in ("real", "ram") if a.disk in (k, "both")]
    parts = [p for p in ("optimizer", "train") if a.part in (p, "both")]
    results, ok = [], True
    load0 = open("/proc/loadavg").read().split()[:3]
    t0 = datetime.datetime.now(datetime.timezone.utc)
    with guestmem.page_reporting_paused(True) as guest, \
            hugepages.reserved(8 * MiB * 128 + 64 * MiB, log) as fio.huge_path, \
            contextlib.ExitStack() as stack:
        dirs = []
        for k in disks:
            if k == "real":
                os.makedirs(a.real_dir, exist_ok=True)
                dirs.append(("real", a.real_dir))
            else:
                dirs.append(("ram", stack.enter_context(ramdisk.mounted(a.ram_size, log))))
        disk_lines = [core_bench.disk_info(k, d) for k, d in dirs]
        for part in parts:
            for disk, d in dirs:
                results.append(run_part(a, part, disk, d, fio))
        huge = "fio with huge-page buffers" if fio.huge_path else \
            "fio WITHOUT huge-page buffers (none could be reserved)"
    load1 = open("/proc/loadavg").read().split()[:3]
    n = results[0]["nvme"]["params"]
    L = ["# Offload on a Llama from a config: the AdamW step and the training step with "
         "state, weights and grads on NVMe (%s)" % t0.strftime("%Y-%m-%d"), "",
         "- date: %s UTC, %d s" % (t0.strftime("%Y-%m-%d %H:%M"),
                                   (datetime.datetime.now(datetime.timezone.utc) - t0).seconds),
         "- machine: %s, %d cores, kernel %s; load average %s at the start, %s at the end "
         "(above ~0.5: other jobs shared the machine)" % (
             platform.node(), os.cpu_count(), platform.release(), " ".join(load0),
             " ".join(load1)),
         "- nvio %s (git %s), torch %s (%d threads in each worker), transformers %s" % (
             nvio.__version__, subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                                              capture_output=True, text=True).stdout.strip(),
             torch.__version__, results[0]["nvme"]["threads"],
             __import__("transformers").__version__)]
    L += disk_lines + ["- %s (bench/guestmem.py); %s (bench/hugepages.py)" % (guest["note"], huge),
                       "- command: `sudo python3 bench/offload_train_bench.py %s`"
                       % " ".join(sys.argv[1:]), "",
                       "Model: LlamaForCausalLM from a LlamaConfig (%d layers, hidden %d, "
                       "intermediate %d, vocab %d, untied head), fp32, random weights (seed 0): "
                       "%d parameters; fp32 weights + AdamW state = 16 B per parameter = "
                       "%.2f GB. Batch %d x %d tokens, AdamW lr 1e-4%s. One untimed warm-up "
                       "step, then %d timed rounds, interleaved: in-memory step, NVMe step, "
                       "fio-best write, fio-best read (file of %.2f GB in the same directory). "
                       "Medians of per-round ratios.%s" % (
                           a.layers, a.hidden, a.inter, a.vocab, n, gb(16 * n), a.batch, a.seq,
                           ", fused=True (torch's one-pass kernel)" if a.fused else
                           " (torch's default on CPU: the single-tensor loop)",
                           a.rounds, gb(a.fio_size),
                           " Both contenders' environment adds %s." % " ".join(a.env)
                           if a.env else ""), ""]
    for res in results:
        part_lines, good = report_part(res, a)
        L += part_lines
        ok = ok and good
    text = "\n".join(L)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if not ok:
        sys.exit("offload_train_bench.py: validation failed (see the report)")


if __name__ == "__main__":
    main()
