#!/usr/bin/env python3
"""nvio under Lightning, the Hugging Face Trainer and DeepSpeed (issue 32).

Not a test: times what a user of each framework sees, stock against nvio,
in interleaved rounds (the contenders' order rotated each round), page
cache dropped (sync; echo 3 > /proc/sys/vm/drop_caches) before every save
and load.

- lightning: ``trainer.save_checkpoint(path)`` of a model with fp32 weights
  and Adam state (--lightning-gb of checkpoint), with Lightning's
  ``TorchCheckpointIO`` (as is, and followed by an fsync of the file: nvio's
  saves are durable) and with ``NvioCheckpointIO``; then each plugin's
  ``load_checkpoint`` of its own file.
- trainer: ``Trainer._save_checkpoint`` of a GPT-2 from a config (random
  weights, AdamW state after one step; --trainer-gb of checkpoint), stock and
  with ``nvio.integrations.transformers.use_nvio``; and
  ``_load_from_checkpoint`` + ``_load_optimizer_and_scheduler``.
- deepspeed: ZeRO-3 on CPU (DS_ACCELERATOR=cpu, gloo, one process), a GPT-2
  with parameters and optimizer state offloaded to NVMe (--ds-params
  millions of parameters), seconds per training step with DeepSpeed's own
  async_io op and with nvio's (``use_nvio()``), one process per run.
- fio: the same bytes written (O_DIRECT, end_fsync) and read with fio, best
  of a few block sizes and depths: the "fio-best" the ratios refer to.

Needs root (drop_caches). Usage::

    sudo python3 bench/integrations_bench.py --dir /nvme/tmp --rounds 3 \
        --out bench/results/integrations-$(date +%F).md
"""
import argparse
import datetime
import gc
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
sys.path.insert(0, os.path.join(REPO, "python"))
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def drop_caches():
    atomic = sys.modules.get("nvio._atomic")
    if atomic is not None:
        atomic.settle_released()
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def fsync_path(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sh(cmd):
    return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()


def tree_bytes(p):
    if os.path.isfile(p):
        return os.path.getsize(p)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(p) for f in fs)


def timed(fn):
    drop_caches()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# ------------------------------------------------------------------- fio

def fio_best(d, size):
    """Seconds for fio's best write (O_DIRECT, fsync at end) and best read of
    ``size`` bytes, over a few block sizes and depths."""
    path = os.path.join(d, "fio.dat")
    best = {}
    for rw in ("write", "read"):
        for bs, qd in (("1M", 16), ("4M", 8), ("8M", 4)):
            drop_caches()
            out = sh("fio --name=f --filename=%s --size=%d --bs=%s --iodepth=%d --direct=1 "
                     "--ioengine=io_uring --rw=%s --end_fsync=1 --output-format=json"
                     % (path, size, bs, qd, rw))
            try:
                job = json.loads(out[out.index("{"):])["jobs"][0]
            except (ValueError, KeyError, IndexError):
                log("fio failed: %s" % out[-300:])
                continue
            secs = job["job_runtime"] / 1000.0 if job.get("job_runtime") else None
            bw = job[rw]["bw_bytes"]
            s = size / bw if bw else secs
            best[rw] = min(best.get(rw, s), s)
    with_fsync = best
    os.unlink(path) if os.path.exists(path) else None
    return with_fsync


# ------------------------------------------------------------- lightning

def lightning_part(a, res):
    import torch
    import lightning as L
    from lightning.pytorch.plugins.io import TorchCheckpointIO
    from nvio.integrations.lightning import NvioCheckpointIO

    n_params = int(a.lightning_gb * 1e9 / 12)        # fp32 weight + 2 Adam moments
    width = 4096
    layers = max(1, round(n_params / (width * width)))

    class Big(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])

        def training_step(self, batch, _):
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    log("lightning: %d x Linear(%d, %d), one step for Adam's state" % (layers, width, width))
    model = Big()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2, width)),
                                       batch_size=2)
    trainer = L.Trainer(max_steps=1, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=a.dir)
    trainer.fit(model, data)
    plugins = {"TorchCheckpointIO": TorchCheckpointIO(),
               "TorchCheckpointIO + fsync": TorchCheckpointIO(),
               "NvioCheckpointIO": NvioCheckpointIO()}
    paths = {n: os.path.join(a.dir, "lightning-%d.ckpt" % i) for i, n in enumerate(plugins)}
    save = {n: [] for n in plugins}
    load = {n: [] for n in plugins if "fsync" not in n}
    names = list(plugins)
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            trainer.strategy.checkpoint_io = plugins[n]

            def go(n=n):
                trainer.save_checkpoint(paths[n])
                if "fsync" in n:
                    fsync_path(paths[n])
            save[n].append(timed(go))
            log("lightning round %d save %-26s %.2f s" % (r, n, save[n][-1]))
        for n in [x for x in order if x in load]:
            def ld(n=n):
                ck = plugins[n].load_checkpoint(paths[n])
                del ck
            load[n].append(timed(ld))
            gc.collect()
            log("lightning round %d load %-26s %.2f s" % (r, n, load[n][-1]))
    size = os.path.getsize(paths["NvioCheckpointIO"])
    res["lightning"] = {"bytes": size, "save": save, "load": load,
                        "model": "%d x Linear(%d, %d), fp32 + Adam" % (layers, width, width)}
    res["lightning"]["fio"] = fio_best(a.dir, size)
    for p in paths.values():
        if os.path.exists(p):
            os.unlink(p)
    del trainer, model
    gc.collect()


# --------------------------------------------------------------- trainer

def trainer_part(a, res):
    import torch
    import transformers
    from nvio.integrations.transformers import use_nvio

    n_params = int(a.trainer_gb * 1e9 / 12)
    d, vocab = 1024, 8192
    layers = max(1, round((n_params - vocab * d) / (12 * d * d)))
    cfg = transformers.GPT2Config(n_embd=d, n_layer=layers, n_head=16, vocab_size=vocab,
                                  n_positions=128)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, vocab, (2, 64))
    data = [{"input_ids": r, "labels": r} for r in ids]
    out = {k: os.path.join(a.dir, "trainer-" + k) for k in ("stock", "nvio")}
    trainers = {}
    for k in out:
        args = transformers.TrainingArguments(
            output_dir=out[k], max_steps=1, per_device_train_batch_size=2, use_cpu=True,
            report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)
        t = transformers.Trainer(model=model, args=args, train_dataset=data)
        trainers[k] = t
    log("trainer: GPT-2 %d layers x %d, vocab %d; one step" % (layers, d, vocab))
    trainers["stock"].train()
    t_nvio = trainers["nvio"]
    t_nvio.optimizer, t_nvio.lr_scheduler = trainers["stock"].optimizer, trainers["stock"].lr_scheduler
    t_nvio.state = trainers["stock"].state
    use_nvio(t_nvio)
    save = {k: [] for k in out}
    load = {k: [] for k in out}
    names = list(out)
    for r in range(a.rounds):
        order = names[r % 2:] + names[:r % 2]
        for k in order:
            t = trainers[k]
            save[k].append(timed(lambda t=t: t._save_checkpoint(t.model, trial=None)))
            log("trainer round %d save %-6s %.2f s" % (r, k, save[k][-1]))
        for k in order:
            t = trainers[k]
            ck = os.path.join(out[k], "checkpoint-%d" % t.state.global_step)

            def ld(t=t, ck=ck):
                t._load_from_checkpoint(ck)
                t._load_optimizer_and_scheduler(ck)
            load[k].append(timed(ld))
            gc.collect()
            log("trainer round %d load %-6s %.2f s" % (r, k, load[k][-1]))
    size = tree_bytes(os.path.join(out["nvio"], "checkpoint-1"))
    res["trainer"] = {"bytes": size, "save": save, "load": load,
                      "model": "GPT-2 %d layers x %d, vocab %d, fp32 + AdamW" % (layers, d, vocab)}
    res["trainer"]["fio"] = fio_best(a.dir, size)
    subprocess.run(["rm", "-rf", *out.values()])
    del trainers, model, t_nvio
    gc.collect()


# ------------------------------------------------------------- deepspeed

DS_WORKER = r"""
import json, os, sys, time
mode, nvme, port, steps, d, layers, vocab = sys.argv[1:8]
steps, d, layers, vocab = int(steps), int(d), int(layers), int(vocab)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1",
                  LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
import torch, deepspeed, transformers
if mode == "nvio":
    from nvio.integrations import deepspeed as nds
    nds.use_nvio()
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_embd=d, n_layer=layers, n_head=16, vocab_size=vocab,
                              n_positions=128, bos_token_id=0, eos_token_id=0,
                              tie_word_embeddings=False)  # tied: DeepSpeed asserts "already assigned swap buffer"
model = transformers.GPT2LMHeadModel(cfg)
big = max(p.numel() for p in model.parameters())
# a buffer for every parameter DeepSpeed swaps (1 MiB and more in bf16): its
# prefetch may have them all in flight
swappable = sum(1 for p in model.parameters() if p.numel() * 2 >= 1 << 20)
config = {
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
    "zero_force_ds_cpu_optimizer": False, "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 50000000,
        "stage3_prefetch_bucket_size": 0,  # with prefetch DeepSpeed asserts "already assigned swap buffer" here
        "offload_param": {"device": "nvme", "nvme_path": nvme, "pin_memory": False,
                          "buffer_count": swappable + 4, "buffer_size": big + 4096, "max_in_cpu": 0},
        "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "pin_memory": False,
                              "buffer_count": 4}},
    "aio": {"block_size": 1048576, "queue_depth": 32, "single_submit": False,
            "overlap_events": True, "intra_op_parallelism": 1},
}
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
g = torch.Generator().manual_seed(1)
times, losses = [], []
for _ in range(steps):
    ids = torch.randint(0, vocab, (1, 64), generator=g)
    t = time.perf_counter()
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    times.append(time.perf_counter() - t)
    losses.append(loss.item().hex())
swapped = sum(os.path.getsize(os.path.join(a, f)) for a, _, fs in os.walk(nvme) for f in fs)
print(json.dumps({"times": times, "losses": losses, "swapped": swapped,
                  "params": sum(p.ds_numel for p in model.parameters())}))
"""


def ds_part(a, res):
    import socket
    d, vocab = 1024, 8192
    layers = max(1, round((a.ds_params * 1e6 - vocab * d) / (12 * d * d)))
    runs = {"DeepSpeed async_io": [], "nvio": []}
    info = {}
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), DS_ACCELERATOR="cpu",
               OMP_WAIT_POLICY="PASSIVE")
    for r in range(a.ds_rounds):
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for name in order:
            nvme = os.path.join(a.dir, "ds-swap")
            subprocess.run(["rm", "-rf", nvme])
            os.makedirs(nvme)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            drop_caches()
            mode = "nvio" if name == "nvio" else "own"
            p = subprocess.run([sys.executable, "-c", DS_WORKER, mode, nvme, str(port),
                                str(a.ds_steps), str(d), str(layers), str(vocab)],
                               capture_output=True, text=True, env=env, timeout=3600)
            lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
            if p.returncode or not lines:
                log("deepspeed %s failed: %s" % (name, p.stderr[-2000:]))
                res["deepspeed_error"] = p.stderr[-1500:]
                return
            got = json.loads(lines[-1])
            runs[name].append(got)
            info = got
            log("deepspeed round %d %-18s steps %s s, %.2f GB swapped" % (
                r, name, " ".join("%.1f" % x for x in got["times"]), got["swapped"] / 1e9))
    res["deepspeed"] = {"runs": runs, "layers": layers, "d": d, "vocab": vocab,
                        "params": info.get("params"), "swapped": info.get("swapped")}
    subprocess.run(["rm", "-rf", os.path.join(a.dir, "ds-swap")])


# ----------------------------------------------------------------- report

def med(xs):
    return statistics.median(xs)


def table(title, part, base, what):
    size = part["bytes"]
    fio = part["fio"].get("write" if what == "save" else "read")
    rows = part[what]
    out = ["**%s** (%.2f GB; seconds, page cache dropped before each)" % (title, size / 1e9), "",
           "| contender | s median | min–max | GB/s | × %s (time) | × fio-best (time) | per round |"
           % base, "|---|---:|---:|---:|---:|---:|---|"]
    for n, v in rows.items():
        out.append("| %s | %.2f | %.2f–%.2f | %.2f | %.2f | %s | %s |" % (
            n, med(v), min(v), max(v), size / med(v) / 1e9,
            med([x / y for x, y in zip(v, rows[base])]),
            "%.2f" % (med(v) / fio) if fio else "n/a", " ".join("%.2f" % x for x in v)))
    out.append("| fio-best (%s) | %s | | %s | | 1.00 | |" % (
        "write + fsync" if what == "save" else "read", "%.2f" % fio if fio else "n/a",
        "%.2f" % (size / fio / 1e9) if fio else "n/a"))
    return out + [""]


def report(a, res, t0):
    mem = sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo")
    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    vers = sh("%s -c 'import torch, lightning, transformers, deepspeed; print(torch.__version__, "
              "lightning.__version__, transformers.__version__, deepspeed.__version__)'"
              % sys.executable)
    out = ["# nvio integrations benchmark — %s" % datetime.date.today().isoformat(), "",
           "- date: %s UTC" % datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
           "- machine: %d cores (%s), %s RAM, kernel %s; load average at start %s" % (
               os.cpu_count(), cpu, mem, platform.release(), res["load"]),
           "- disk: %s — %s" % (a.dir, sh("findmnt -n -o SOURCE,FSTYPE --target %s" % a.dir)),
           "- torch / lightning / transformers / deepspeed: %s; fio %s" % (vers, sh("fio --version")),
           "- nvio: git %s%s" % (sh("git -C %s rev-parse --short HEAD" % REPO),
                                 " + uncommitted changes" if sh("git -C %s status --porcelain python src"
                                                                % REPO) else ""),
           "- command: `%s`" % " ".join(shlex.quote(x) for x in sys.argv),
           "- wall time: %.0f min; rounds interleaved, the order rotated each round" % (
               (time.time() - t0) / 60), ""]
    if "lightning" in res:
        L = res["lightning"]
        out += ["## Lightning: trainer.save_checkpoint / load_checkpoint", "",
                "Model: %s. `TorchCheckpointIO + fsync`: Lightning's default followed by "
                "an fsync of the file (nvio's save is fsynced before it replaces the old "
                "file)." % L["model"], ""]
        out += table("save", L, "TorchCheckpointIO", "save")
        out += table("load", L, "TorchCheckpointIO", "load")
    if "trainer" in res:
        T = res["trainer"]
        out += ["## Hugging Face Trainer: _save_checkpoint / resume", "",
                "Model: %s; a checkpoint directory (model.safetensors, optimizer.pt, "
                "scheduler.pt, rng_state.pth, trainer_state.json, config). Stock writes "
                "without fsync; nvio fsyncs each file it writes." % T["model"], ""]
        out += table("_save_checkpoint", T, "stock", "save")
        out += table("_load_from_checkpoint + _load_optimizer_and_scheduler", T, "stock", "load")
    if "deepspeed" in res:
        D = res["deepspeed"]
        out += ["## DeepSpeed ZeRO-3, parameters and optimizer state on NVMe (CPU)", "",
                "GPT-2 %d layers x %d, vocab %d: %.0f M parameters, %.2f GB in swap files; "
                "batch 1 x 64 tokens, fused AdamW, bf16, one process per run, %d steps each "
                "(the first left out of the median)." % (
                    D["layers"], D["d"], D["vocab"], (D["params"] or 0) / 1e6,
                    (D["swapped"] or 0) / 1e9, a.ds_steps), "",
                "| op | s/step median | per run (steps 2..) | losses equal to DeepSpeed's |",
                "|---|---:|---|---|"]
        ref = D["runs"]["DeepSpeed async_io"]
        for n, runs in D["runs"].items():
            steps = [t for r in runs for t in r["times"][1:]]
            same = all(r["losses"] == ref[0]["losses"] for r in runs)
            out.append("| %s | %.2f | %s | %s |" % (
                n, med(steps), " / ".join(" ".join("%.1f" % t for t in r["times"][1:]) for r in runs),
                "yes" if same else "NO"))
        nv = med([t for r in D["runs"]["nvio"] for t in r["times"][1:]])
        own = med([t for r in ref for t in r["times"][1:]])
        out += ["", "nvio / DeepSpeed step time: %.2f" % (nv / own), ""]
    if "deepspeed_error" in res:
        out += ["DeepSpeed part failed: ```%s```" % res["deepspeed_error"], ""]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default="/var/tmp/nvio-int-bench")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--parts", default="lightning,trainer,deepspeed")
    p.add_argument("--lightning-gb", type=float, default=1.5)
    p.add_argument("--trainer-gb", type=float, default=1.5)
    p.add_argument("--ds-params", type=float, default=100, help="millions of parameters")
    p.add_argument("--ds-rounds", type=int, default=2)
    p.add_argument("--ds-steps", type=int, default=3)
    p.add_argument("--out")
    a = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("integrations_bench.py: needs root (drop_caches)")
    os.makedirs(a.dir, exist_ok=True)
    t0 = time.time()
    res = {"load": sh("cut -d' ' -f1-3 /proc/loadavg")}
    import torch
    torch.set_num_threads(os.cpu_count())
    parts = a.parts.split(",")
    if "lightning" in parts:
        lightning_part(a, res)
    if "trainer" in parts:
        trainer_part(a, res)
    if "deepspeed" in parts:
        ds_part(a, res)
    text = "\n".join(report(a, res, t0)) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
