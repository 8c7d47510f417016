#!/usr/bin/env python3
"""bench/fuzz_safetensors.py - fuzz nvio.safetensors' header parser and loaders.

A seed corpus of valid files (every dtype, scalars, empty tensors,
metadata, names of every length, made by safetensors.torch.save) is mutated
(bit flips, byte stores, truncation, appended bytes, a rewritten length
prefix, JSON-aware edits of numbers, dtypes, keys and offsets, splices of
two seeds) and each input is given to

  nvio.safetensors.load(bytes)               every input
  nvio.safetensors.load_file / safe_open     every --file-every'th input, on
                                             the default handle (real I/O)

The only acceptable outcomes are tensors or SafetensorsError. Anything
else is counted and its input kept: another exception, a crash (the worker
dies by a signal), a hang (an input taking over --timeout seconds), or a
worker whose peak RSS grows past --max-rss-mib. Differential check: where
safetensors.torch.load accepts an input nvio accepts too, the tensors must
be equal byte for byte; inputs one accepts and the other refuses are
counted by reason.

Workers are subprocesses (a crash cannot take the fuzzer down); each runs
batches of inputs from its own seed and records the input it is on.

    python3 bench/fuzz_safetensors.py --seconds 180 --out bench/results/x.md
"""
import argparse
import collections
import datetime
import json
import os
import platform
import random
import re
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


# --- corpus and mutations (run in the workers) ---------------------------------


def seeds():
    import torch
    import safetensors.torch as st
    out = []
    dts = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.uint16,
           torch.uint32, torch.uint64, torch.complex64, torch.float8_e4m3fn,
           torch.float8_e5m2, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2]
    g = torch.Generator().manual_seed(0)
    for i, dt in enumerate(dts):
        shape = [(3, 4), (5,), (), (0, 2), (2, 1, 2)][i % 5]
        if dt == torch.float4_e2m1fn_x2:
            shape = (2, 2)
        n = 1
        for s in shape:
            n *= s
        es = torch.empty(0, dtype=dt).element_size()
        t = torch.randint(0, 256, (n * es,), dtype=torch.uint8, generator=g)
        if dt == torch.bool:
            t &= 1
        out.append(st.save({"t" * (i % 7 + 1): t.view(dt).reshape(shape)}))
    out.append(st.save({"a": torch.zeros(3), "b": torch.ones(2, 2, dtype=torch.float16),
                        "c": torch.arange(5)}, {"format": "pt", "k": "v"}))
    out.append(st.save({}, {"only": "metadata"}))
    out.append(st.save({"x": torch.zeros(0)}))
    out.append(st.save({"big": torch.randn(64, 64, generator=g), "s": torch.tensor(1)}))
    return out


NUM = re.compile(rb"-?\d+")
TOKENS = [b'"F32"', b'"BF16"', b'"U8"', b'"F4"', b'"F6_E2M3"', b'"C64"', b'"X"', b"[]",
          b"[0]", b"{}", b"null", b"true", b"-1", b"1e400", b"NaN", b'"__metadata__"',
          b'"data_offsets"', b'"shape"', b'"dtype"', b",", b":", b"{", b"}", b"[", b"]",
          b"18446744073709551615", b"9" * 30, b'"\\ud800"', b"\xff", b"\x00"]
BIG = [0, 1, 2, 7, 8, 255, 256, 4096, 65535, 1 << 31, 1 << 32, 1 << 63, (1 << 64) - 1,
       10 ** 15, 10 ** 8, 99_999_999, 100_000_001]


def split(b):
    if len(b) < 8:
        return None, b
    n = struct.unpack("<Q", b[:8])[0]
    if 8 + n > len(b):
        return None, b
    return b[8:8 + n], b[8 + n:]


def mutate(rng, corpus):
    b = bytearray(rng.choice(corpus))
    for _ in range(rng.choice((1, 1, 1, 2, 3, 5))):
        try:
            b = bytearray(_one(rng, b, corpus))
        except (TypeError, ValueError, KeyError, IndexError, RecursionError):
            pass                      # a mutation that did not apply (the mutator's own limits)
    return bytes(b)


def _one(rng, b, corpus):
    k = rng.randrange(12)
    hdr, data = split(bytes(b))
    if k == 0 and b:                                   # flip bits
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    elif k == 1 and b:                                 # store a byte
        b[rng.randrange(len(b))] = rng.randrange(256)
    elif k == 2:                                       # truncate
        b = b[:rng.randrange(len(b) + 1)]
    elif k == 3:                                       # append
        b = b + bytes(rng.randrange(256) for _ in range(rng.choice((1, 3, 8, 100))))
    elif k == 4:                                       # rewrite the length prefix
        n = rng.choice(BIG + [len(b) - 8 + rng.randint(-9, 9)])
        b = bytearray(struct.pack("<Q", max(0, min(n, (1 << 64) - 1)))) + b[8:]
    elif k in (5, 6) and hdr is not None:              # change a number in the header
        ms = list(NUM.finditer(hdr))
        if ms:
            m = rng.choice(ms)
            v = int(m.group()) + rng.choice((-1, 1, 2, -8, 8)) if k == 5 else rng.choice(BIG)
            hdr = hdr[:m.start()] + str(v).encode() + hdr[m.end():]
            b = _pack(hdr, data, keep_len=rng.random() < 0.3)
    elif k == 7 and hdr is not None:                   # insert a token
        i = rng.randrange(len(hdr) + 1)
        b = _pack(hdr[:i] + rng.choice(TOKENS) + hdr[i:], data)
    elif k == 8 and hdr is not None:                   # delete a span
        i = rng.randrange(len(hdr) + 1)
        b = _pack(hdr[:i] + hdr[i + rng.randrange(1, 20):], data)
    elif k == 9 and hdr is not None:                   # edit the JSON structurally
        b = _json_edit(rng, hdr, data)
    elif k == 10:                                      # splice two inputs
        o = rng.choice(corpus)
        b = b[:rng.randrange(len(b) + 1)] + o[rng.randrange(len(o) + 1):]
    elif k == 11 and hdr is not None:                  # duplicate an entry textually
        m = re.search(rb'"[^"]*":\{"dtype"[^}]*\}', hdr)
        if m:
            hdr = hdr[:m.end()] + b"," + m.group() + hdr[m.end():]
            b = _pack(hdr, data)
    return b


def _pack(hdr, data, keep_len=False):
    return struct.pack("<Q", len(hdr)) + hdr + data


def _json_edit(rng, hdr, data):
    try:
        obj = json.loads(hdr)
    except (ValueError, RecursionError):
        return _pack(hdr, data)
    if not isinstance(obj, dict):
        return _pack(hdr, data)
    names = [k for k in obj if k != "__metadata__"]
    if not names:
        obj["n%d" % rng.randrange(9)] = {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}
    else:
        e = obj[rng.choice(names)]
        if not isinstance(e, dict):
            e = obj[rng.choice(names)] = {}
        what = rng.randrange(8)
        if what == 0:
            e["dtype"] = rng.choice(["F32", "U8", "BOOL", "F4", "F6_E3M2", "Q8", 5, None])
        elif what == 1:
            e["shape"] = rng.choice([[], [0], [1 << 40], [-1], [2, 3], "x", [1.5], [1] * 70,
                                     [2 ** 32, 2 ** 32]])
        elif what == 2:
            e["data_offsets"] = rng.choice([[0, 0], [1, 0], [0], [0, 1 << 62], "x",
                                            [len(data), len(data) + 4]])
        elif what == 3:
            if e:
                del e[rng.choice(list(e))]
        elif what == 4:
            a, b2 = (e.get("data_offsets") or [0, 0])[:2] if isinstance(
                e.get("data_offsets"), list) and len(e["data_offsets"]) == 2 else (0, 0)
            e["data_offsets"] = [b2, a]
        elif what == 5:
            obj["__metadata__"] = rng.choice([{"a": 1}, [], "x", {"k": "v"}, None])
        elif what == 6:
            obj[rng.choice(names)] = rng.choice([1, "s", [], None])
        else:
            obj.pop(rng.choice(names))
    try:
        h = json.dumps(obj, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        return _pack(hdr, data)
    return _pack(h + b" " * (-len(h) % 8), data)


# --- the worker --------------------------------------------------------------------


def worker(args):
    import torch
    import safetensors.torch as st
    from nvio import safetensors as nst
    rng = random.Random(args.seed)
    corpus = seeds()
    tmp = args.tmp
    cur = os.path.join(tmp, "current-%d.bin" % args.seed)
    path = os.path.join(tmp, "input-%d.safetensors" % args.seed)
    stats = collections.Counter()
    bad = []
    slow = 0.0
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("hang")))

    def raw(t):
        return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()

    def verdict(fn):
        try:
            return "ok", fn()
        except nst.SafetensorsError as e:
            return "refused:" + _reason(str(e).replace(path + ": ", "")), None

    end = time.time() + args.seconds
    i = 0
    while time.time() < end:
        data = mutate(rng, corpus) if i % 50 else rng.choice(corpus)
        with open(cur, "wb") as f:
            f.write(data)
        t0 = time.perf_counter()
        signal.alarm(args.timeout)
        try:
            v, got = verdict(lambda: nst.load(data))
            if i % args.file_every == 0:
                with open(path, "wb") as f:
                    f.write(data)
                v2, got2 = verdict(lambda: nst.load_file(path))
                if v2 != v:
                    bad.append(("load vs load_file: %s / %s" % (v, v2), data.hex()[:400]))
                if v2 == "ok":
                    with nst.safe_open(path) as so:
                        for k in so.keys():
                            if raw(so.get_tensor(k)) != raw(got2[k]):
                                bad.append(("safe_open differs on %r" % k, data.hex()[:400]))
            try:
                ref = st.load(data)
                ref_v = "ok"
            except BaseException as e:  # noqa: BLE001  (safetensors' own verdicts vary)
                ref, ref_v = None, type(e).__name__
            stats[v] += 1
            if v == "ok" and ref_v == "ok":
                for k in ref:
                    if k not in got or got[k].dtype != ref[k].dtype or \
                            tuple(got[k].shape) != tuple(ref[k].shape) or raw(got[k]) != raw(ref[k]):
                        bad.append(("differs from safetensors on %r" % k, data.hex()[:400]))
                        break
            elif (v == "ok") != (ref_v == "ok"):
                stats["disagree: nvio %s / safetensors %s" % (v, ref_v)] += 1
            del got, ref
        except TimeoutError:
            bad.append(("hang (> %d s)" % args.timeout, data.hex()[:400]))
        except Exception as e:  # noqa: BLE001  (what the fuzzer looks for)
            bad.append(("%s: %s" % (type(e).__name__, str(e)[:200]), data.hex()[:400]))
        finally:
            signal.alarm(0)
        slow = max(slow, time.perf_counter() - t0)
        i += 1
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(json.dumps(dict(n=i, stats=stats, bad=bad, slowest=slow, rss_mib=rss)))


def _reason(msg):
    """A refusal's message without the names and numbers (its kind)."""
    m = msg.replace("nvio.safetensors: ", "", 1)
    m = re.sub(r"tensor '.*?': ", "", m)
    m = re.sub(r"'[^']*'|\"[^\"]*\"|\[[^\]]*\]|\([^)]*\)|\d+", "_", m)
    return m[:70]


# --- the parent -----------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=float, default=30, help="seconds per worker run")
    ap.add_argument("--timeout", type=int, default=10)
    ap.add_argument("--file-every", type=int, default=10)
    ap.add_argument("--max-rss-mib", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        a.seconds = a.batch
        return worker(a)
    t0 = time.time()
    total = collections.Counter()
    bad, crashes, n, slow, rss = [], [], 0, 0.0, 0
    seed = a.seed * 1000
    with tempfile.TemporaryDirectory(prefix="nvio-fuzz-") as tmp:
        while time.time() - t0 < a.seconds:
            procs = []
            for _ in range(a.workers):
                seed += 1
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--seed", str(seed),
                       "--batch", str(min(a.batch, max(1, a.seconds - (time.time() - t0)))),
                       "--timeout", str(a.timeout), "--file-every", str(a.file_every),
                       "--tmp", tmp]
                procs.append((seed, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                     stderr=subprocess.PIPE, text=True)))
            for s, p in procs:
                out, err = p.communicate(timeout=a.batch + 10 * a.timeout + 300)
                if p.returncode != 0:
                    cur = os.path.join(tmp, "current-%d.bin" % s)
                    data = open(cur, "rb").read().hex()[:400] if os.path.exists(cur) else "?"
                    crashes.append(("worker seed %d exit %d: %s" % (s, p.returncode,
                                                                    err.strip()[-300:]), data))
                    continue
                r = json.loads(out.strip().splitlines()[-1])
                n += r["n"]
                total.update(r["stats"])
                bad += r["bad"]
                slow = max(slow, r["slowest"])
                rss = max(rss, r["rss_mib"])
                print("[%s] %d inputs, %d findings, %d crashes" % (
                    time.strftime("%H:%M:%S"), n, len(bad), len(crashes)), file=sys.stderr)
    big = rss > a.max_rss_mib
    lines = ["# fuzzing nvio.safetensors — %s" % datetime.date.today(), "",
             "- date: %s UTC; %.0f s of fuzzing, %d worker processes side by side" % (
                 datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), time.time() - t0,
                 a.workers),
             "- machine: %d cores, kernel %s, Python %s; shared with other jobs" % (
                 os.cpu_count(), platform.release(), platform.python_version()),
             "- nvio commit: %s" % subprocess.run(
                 ["git", "-C", REPO, "log", "-1", "--format=%h %s"], capture_output=True,
                 text=True).stdout.strip(),
             "- command: `%s`" % " ".join(["python3"] + sys.argv),
             "- seed corpus: %d valid files from safetensors.torch.save (every dtype, scalars, "
             "empty tensors, metadata); mutations: bit flips, byte stores, truncation, appends, "
             "length prefix rewrites, header number edits, token inserts, span deletes, JSON "
             "edits, splices, duplicated entries" % 22,
             "", "## Result", "",
             "| inputs | crashes | hangs or other exceptions | slowest input | peak RSS of a worker |",
             "|---:|---:|---:|---:|---:|",
             "| %d | %d | %d | %.3f s | %d MiB%s |" % (n, len(crashes), len(bad), slow, rss,
                                                     " (over the limit!)" if big else ""),
             "", "## Outcomes (nvio.safetensors.load; refusals by message kind)", "",
             "| outcome | inputs |", "|---|---:|"]
    for k, v in total.most_common():
        lines.append("| %s | %d |" % (k.replace("|", "\\|"), v))
    if bad or crashes:
        lines += ["", "## Findings (input hex, first 200 bytes)", ""]
        for what, h in (crashes + bad)[:50]:
            lines.append("- %s: `%s`" % (what, h))
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 1 if (bad or crashes or big) else 0


if __name__ == "__main__":
    sys.exit(main() or 0)
