#!/usr/bin/env python3
"""bench/stream_model_bench.py - greedy generation with a model's decoder
layers read from disk: nvio.offload.run_from_disk against accelerate's
disk offload and the model in memory, plus fio-best on the same files, in
interleaved rotated rounds (../shared/BENCHMARKING.md).

The model: a Llama-style transformer from a config (random weights, fp32,
~2.6 GB by default) saved once with save_pretrained (safetensors shards) in
--dir. Each contender runs in a child process (so its peak RSS is its own):

  memory      from_pretrained(dir): everything in memory
  nvio        model built on the meta device (accelerate.init_empty_weights,
              buffers real), nvio.offload.run_from_disk(model, dir,
              prefetch=P): layers read straight from the shards (O_DIRECT)
  accelerate  from_pretrained(dir, device_map={layers: "disk", rest: "cpu"},
              offload_folder=...): accelerate's disk offload
  fio-best    the better of libaio 1 MiB x QD32 x 1 job and 8 MiB x QD32 x
              2 jobs, O_DIRECT, huge-page buffers, reading the first shard

Modes: "cold" drops the page cache before every forward (a model bigger
than memory: no weight is in the page cache when its layer runs; the drop
itself is not timed); "warm" drops it once before the run, so the page
cache may hold the weights after the first forward (plenty of memory).

    python3 bench/stream_model_bench.py --dir /var/tmp/nvio-stream --rounds 3 \\
        --out bench/results/stream-model-DATE.md
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MiB = 1 << 20


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def config(a):
    import transformers
    return transformers.LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.inter,
        num_hidden_layers=a.layers, num_attention_heads=a.hidden // 128,
        num_key_value_heads=a.hidden // 128, max_position_embeddings=4096,
        bos_token_id=1, eos_token_id=2, torch_dtype="float32")


def prepare(a):
    if os.path.exists(os.path.join(a.dir, "config.json")):
        return
    import torch
    import transformers
    os.makedirs(a.dir, exist_ok=True)
    log("building and saving the model in %s" % a.dir)
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(config(a))
    m.save_pretrained(a.dir, max_shard_size="1GB")


# --- one contender, in a child process ----------------------------------------


def child(a):
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(1)
    ids = torch.randint(3, a.vocab, (a.batch, a.prompt))
    t0 = time.perf_counter()
    extra = {}
    if a.child == "memory":
        m = transformers.AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32)
    elif a.child == "accelerate":
        n = a.layers
        dmap = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu",
                "lm_head": "cpu"}
        dmap.update({"model.layers.%d" % i: "disk" for i in range(n)})
        m = transformers.AutoModelForCausalLM.from_pretrained(
            a.dir, dtype=torch.float32, device_map=dmap,
            offload_folder=os.path.join(a.scratch, "accelerate-offload"))
    else:
        import accelerate
        import nvio.offload
        with accelerate.init_empty_weights(include_buffers=False):
            m = transformers.AutoModelForCausalLM.from_config(config(a))
        nvio.offload.run_from_disk(m, a.dir, prefetch=a.prefetch)
    m.eval()
    setup_s = time.perf_counter() - t0
    fwd, drops = [], []

    def pre(mod, args):
        if a.mode == "cold":
            t = time.perf_counter()
            drop_caches()
            drops.append(time.perf_counter() - t)
        fwd.append(time.perf_counter())

    def post(mod, args, out):
        fwd[-1] = time.perf_counter() - fwd[-1]

    m.register_forward_pre_hook(pre)
    m.register_forward_hook(post)
    rss0 = status_kb("VmRSS")
    drop_caches()
    cpu0 = os.times()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=a.tokens, min_new_tokens=a.tokens,
                         do_sample=False, pad_token_id=0)
    wall = time.perf_counter() - t0 - sum(drops)
    cpu1 = os.times()
    assert out.shape[1] == a.prompt + a.tokens
    if a.child == "nvio":
        s = m._nvio_from_disk.stats()
        extra = {k: s[k] for k in ("bytes_read", "wait_s", "pool_bytes", "resident_bytes",
                                   "peak_weight_bytes", "streamed_bytes", "block_reads")}
    res = dict(contender=a.child, wall=wall, tok_s=a.batch * a.tokens / wall, forwards=fwd,
               setup_s=setup_s, rss_before_kb=rss0, peak_rss_kb=status_kb("VmHWM"),
               rss_anon_kb=status_kb("RssAnon"), rss_file_kb=status_kb("RssFile"),
               cpu_s=(cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
               tokens=out[0, a.prompt:].tolist(), **extra)
    print("RESULT " + json.dumps(res), flush=True)


CGROUP_V1 = "/sys/fs/cgroup/memory"


def run_child(a, name, mode):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--mode", mode]
    for k in ("dir", "scratch", "layers", "hidden", "inter", "vocab", "batch", "prompt",
              "tokens", "prefetch"):
        cmd += ["--" + k, str(getattr(a, k))]
    drop_caches()
    cg = None
    if a.limit_bytes:
        # a cgroup v1 memory group: its limit charges the page cache too, so
        # the child cannot keep the model cached, as on a machine whose
        # memory is smaller than the model
        cg = os.path.join(CGROUP_V1, "nvio-stream-bench-%d" % os.getpid())
        os.makedirs(cg, exist_ok=True)
        with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
            f.write(str(a.limit_bytes))
        with open(os.path.join(cg, "memory.max_usage_in_bytes"), "w") as f:
            f.write("0")

    def enter():
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                           preexec_fn=enter if cg else None)
        cg_peak = cg_fail = None
        if cg:
            with open(os.path.join(cg, "memory.max_usage_in_bytes")) as f:
                cg_peak = int(f.read())
            with open(os.path.join(cg, "memory.failcnt")) as f:
                cg_fail = int(f.read())
    finally:
        if cg:
            try:
                with open(os.path.join(cg, "memory.force_empty"), "w") as f:
                    f.write("0")
            except OSError:
                pass
            os.rmdir(cg)
    if p.returncode:
        raise RuntimeError("%s failed (exit %d%s):\n%s" % (
            name, p.returncode, ", killed: over the memory cgroup's limit?" if
            p.returncode == -9 and cg else "", p.stderr[-3000:]))
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    res = json.loads(line[len("RESULT "):])
    res.update(cg_peak=cg_peak, cg_failcnt=cg_fail)
    return res


# --- fio-best -----------------------------------------------------------------


def fio_best(a, fio, path, size):
    cfgs = [dict(engine="libaio", block=MiB, qd=32, jobs=1, huge=1),
            dict(engine="libaio", block=8 * MiB, qd=32, jobs=2, huge=1)]
    return max((fio.run_fio("read", path, size, c) for c in cfgs), key=lambda x: x["gbps"])


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except Exception:  # noqa: BLE001
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/var/tmp/nvio-stream-bench")
    ap.add_argument("--scratch", default=None)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="cold,warm")
    ap.add_argument("--contenders", default="nvio,accelerate,memory,fio-best")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None)
    ap.add_argument("--mode", default="cold")
    ap.add_argument("--memory-limit", default=None, metavar="BYTES|third",
                    help="run every contender in a cgroup v1 memory group with this limit "
                         "(page cache charged too); 'third': a third of the weights' bytes. "
                         "The in-memory contender is left out (the model does not fit)")
    a = ap.parse_args()
    a.scratch = a.scratch or a.dir + "-scratch"
    if a.child:
        return child(a)
    os.makedirs(a.scratch, exist_ok=True)
    prepare(a)
    sys.path.insert(0, HERE)
    import argparse as _ap
    import core_bench
    import hugepages
    shards = sorted(f for f in os.listdir(a.dir) if f.endswith(".safetensors"))
    weight_bytes = sum(os.path.getsize(os.path.join(a.dir, f)) for f in shards)
    first = os.path.join(a.dir, shards[0])
    fsize = os.path.getsize(first) // (16 * MiB) * (16 * MiB)
    fio = core_bench.Bench.__new__(core_bench.Bench)
    fio.args = _ap.Namespace(quick=False)
    fio.log = log
    a.limit_bytes = None
    if a.memory_limit:
        if not os.path.isdir(CGROUP_V1):
            raise SystemExit("--memory-limit needs the cgroup v1 memory controller at " + CGROUP_V1)
        a.limit_bytes = (weight_bytes // 3 if a.memory_limit == "third"
                         else int(float(a.memory_limit)))
        log("memory cgroup limit %.2f GB (weights %.2f GB)" % (a.limit_bytes / 1e9,
                                                               weight_bytes / 1e9))
    names = [c for c in a.contenders.split(",") if c and not (a.limit_bytes and c == "memory")]
    modes = [m for m in a.modes.split(",") if m]
    res = {(m, n): [] for m in modes for n in names}
    t_start = time.time()
    with hugepages.reserved(8 * MiB * 32 * 2 + 64 * MiB, log) as hp:
        fio.huge_path = hp
        for r in range(a.rounds):
            for mode in modes:
                order = names[r % len(names):] + names[:r % len(names)]
                for n in order:
                    if n == "fio-best":
                        if mode != modes[0]:
                            continue
                        x = fio_best(a, fio, first, fsize)
                        res[(mode, n)].append(x)
                        log("round %d fio-best %.2f GB/s" % (r + 1, x["gbps"]))
                        continue
                    x = run_child(a, n, mode)
                    res[(mode, n)].append(x)
                    log("round %d %s %s: %.3f tok/s, forwards %s, peak RSS %.2f GiB" % (
                        r + 1, mode, n, x["tok_s"], " ".join("%.2f" % f for f in x["forwards"]),
                        x["peak_rss_kb"] / 2**20))
    report(a, res, names, modes, weight_bytes, t_start)


def report(a, res, names, modes, weight_bytes, t_start):
    import torch
    import nvio
    lines = ["# run_from_disk: layers read from disk — %s" % datetime.date.today().isoformat(),
             ""]
    mem = sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo")
    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    import accelerate
    import transformers
    lines += [
        "- date: %s" % datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "- machine: %s cores (%s), %s RAM, kernel %s; load average %s at the end (above "
        "~0.5: other jobs shared the machine)" % (
            os.cpu_count(), cpu, mem, platform.release(), sh("cut -d' ' -f1-3 /proc/loadavg")),
        "- disk: %s (%s)" % (a.dir, sh("findmnt -n -o SOURCE,FSTYPE --target %s" % a.dir)),
        "- nvio %s (git %s), torch %s, transformers %s, accelerate %s, fio %s" % (
            nvio.__version__, sh("git -C %s rev-parse --short HEAD" % REPO), torch.__version__,
            transformers.__version__, accelerate.__version__, sh("fio --version")),
        "- command: `%s`" % " ".join(shlex.quote(x) for x in sys.argv),
        "- wall time: %.0f min; rounds: %d, contenders rotated each round" % (
            (time.time() - t_start) / 60, a.rounds),
        "- model: Llama-style, %d layers, hidden %d, intermediate %d, vocab %d, fp32, random "
        "weights; %.2f GB of safetensors in %d shards (save_pretrained, max_shard_size=1GB)" % (
            a.layers, a.hidden, a.inter, a.vocab, weight_bytes / 1e9,
            len([f for f in os.listdir(a.dir) if f.endswith(".safetensors")])),
        "- work: greedy generate, batch %d, prompt %d tokens, %d new tokens (= %d forwards); "
        "tokens/s = batch x new tokens / generate wall time" % (
            a.batch, a.prompt, a.tokens, a.tokens),
        "- nvio: prefetch=%d (pool of %d slots)" % (a.prefetch, a.prefetch + 1),
    ]
    if a.limit_bytes:
        lines += ["- **every contender ran in a memory cgroup (v1) limited to %.2f GB = %.2f× "
                  "the weights' bytes**; the limit charges the page cache, so the weights "
                  "cannot stay cached between forwards whatever the mode" % (
                      a.limit_bytes / 1e9, a.limit_bytes / weight_bytes)]
    lines += [""]
    fio = res.get((modes[0], "fio-best"), [])
    fio_gbps = med([x["gbps"] for x in fio]) if fio else None
    for mode in modes:
        runs = {n: res[(mode, n)] for n in names if n != "fio-best"}
        lines += ["## %s (%s)" % (mode, "page cache dropped before every forward: the weights "
                                  "are never cached, as for a model bigger than memory"
                                  if mode == "cold" else "page cache dropped once before the "
                                  "run; it may hold the weights after the first forward"), ""]
        lines += ["| contender | tokens/s median | min–max | × accelerate | × memory | "
                  "decode forward s (median) | peak RSS GiB | RSS growth GiB | cgroup peak GB |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for n, v in runs.items():
            if not v:
                continue
            ts = [x["tok_s"] for x in v]

            def ratio(other):
                o = runs.get(other)
                if not o or other == n:
                    return "—"
                return "%.2f" % med([x["tok_s"] / y["tok_s"] for x, y in zip(v, o)])
            dec = med([med(x["forwards"][1:]) for x in v])
            cgp = [x["cg_peak"] for x in v if x.get("cg_peak")]
            lines.append("| %s | %.3f | %.3f–%.3f | %s | %s | %.2f | %.2f | %.2f | %s |" % (
                n, med(ts), min(ts), max(ts), ratio("accelerate"), ratio("memory"), dec,
                med([x["peak_rss_kb"] / 2**20 for x in v]),
                med([(x["peak_rss_kb"] - x["rss_before_kb"]) / 2**20 for x in v]),
                "%.2f" % (med(cgp) / 1e9) if cgp else "—"))
        lines.append("")
        nv = runs.get("nvio") or []
        if nv and fio_gbps:
            per_fwd = nv[0]["streamed_bytes"]
            bound = per_fwd / (fio_gbps * 1e9)
            dec = med([med(x["forwards"][1:]) for x in nv])
            lines += [
                "nvio per decode forward: %.2f GB streamed; I/O bound (fio-best %.2f GB/s) "
                "%.2f s; measured %.2f s = %.2f× the bound; time blocked waiting for reads "
                "%.2f s per forward; achieved %.2f GB/s of weights; resident weights %.2f GB + "
                "pool %.2f GB = %.2f GB peak resident weight memory (stats())." % (
                    per_fwd / 1e9, fio_gbps, bound, dec, dec / bound,
                    med([x["wait_s"] / len(x["forwards"]) for x in nv]),
                    per_fwd / 1e9 / dec, nv[0]["resident_bytes"] / 1e9,
                    nv[0]["pool_bytes"] / 1e9, nv[0]["peak_weight_bytes"] / 1e9), ""]
        mm = runs.get("memory") or []
        same = all(x["tokens"] == mm[0]["tokens"] for n2 in runs for x in runs[n2]) if mm else None
        if same is not None:
            lines += ["Generated tokens identical across contenders and rounds: %s" % same, ""]
    lines += ["## raw", "", "fio-best GB/s per round: %s" % ", ".join(
        "%.2f" % x["gbps"] for x in fio), ""]
    for (mode, n), v in res.items():
        if n == "fio-best":
            continue
        for i, x in enumerate(v):
            lines.append("- %s %s round %d: %.3f tok/s, wall %.1f s, forwards [%s] s, setup "
                         "%.1f s, CPU %.1f s, peak RSS %.2f GiB (anon %.2f, file %.2f at end)" % (
                             mode, n, i + 1, x["tok_s"], x["wall"],
                             " ".join("%.2f" % f for f in x["forwards"]), x["setup_s"],
                             x["cpu_s"], x["peak_rss_kb"] / 2**20, x["rss_anon_kb"] / 2**20,
                             x["rss_file_kb"] / 2**20))
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
