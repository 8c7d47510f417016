#!/usr/bin/env python3
"""bench/stream_store_crc_bench.py - what checking nvio's weight store by
CRC-32 costs a model run from disk: greedy generation with run_from_disk(...,
source="store") with verify=True against verify=False, in interleaved
rounds (the order alternates), with reads through the page cache (every
block a memory copy: the CRC's worst case) and with O_DIRECT.

The model: a small Llama-style transformer (random fp32 weights) in memory;
the store is written once into --dir. Reports the median generate() time
of each setting, the overhead of verify=True, and the CRC time the
streamer measured (stats()["crc_s"]).

    python3 bench/stream_store_crc_bench.py --dir /var/tmp/nvio-crc --rounds 5
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import nvio  # noqa: F401  (installed: pip install .)
except ImportError:    # an in-place build of this source tree
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp/nvio-crc-bench")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--inter", type=int, default=2816)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--prefetch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--direct", default="0,1", help="which of 0 (page cache), 1 (O_DIRECT)")
    a = ap.parse_args()

    import torch
    import transformers
    import nvio.offload
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.inter,
        num_hidden_layers=a.layers, num_attention_heads=a.hidden // 128,
        num_key_value_heads=a.hidden // 128, bos_token_id=1, eos_token_id=2)
    m = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(3, a.vocab, (a.batch, a.prompt))
    os.makedirs(a.dir, exist_ok=True)
    nvio.offload.run_from_disk(m, a.dir, source="store")      # writes the store once
    streamed = m._nvio_from_disk.stats()["streamed_bytes"]
    nvio.offload.run_from_memory(m)
    print("model: %d layers, %.0f MB streamed per forward; %d threads; %d rounds"
          % (a.layers, streamed / 1e6, torch.get_num_threads(), a.rounds), flush=True)
    times = {}
    crc_s = {}
    for r in range(a.rounds):
        for direct in [d == "1" for d in a.direct.split(",")]:
            order = (False, True) if r % 2 == 0 else (True, False)
            for verify in order:
                nvio.offload.run_from_disk(m, a.dir, source="store", prefetch=a.prefetch,
                                           direct=direct, verify=verify)
                t0 = time.perf_counter()
                with torch.no_grad():
                    m.generate(ids, max_new_tokens=a.tokens, min_new_tokens=a.tokens,
                               do_sample=False, pad_token_id=0)
                t = time.perf_counter() - t0
                s = m._nvio_from_disk.stats()
                assert s["crc"] is verify
                nvio.offload.run_from_memory(m)
                times.setdefault((direct, verify), []).append(t)
                crc_s.setdefault((direct, verify), []).append((s["crc_s"], s["crc_wait_s"]))
    for direct in [d == "1" for d in a.direct.split(",")]:
        off = statistics.median(times[(direct, False)])
        on = statistics.median(times[(direct, True)])
        c = crc_s[(direct, True)]
        print("%-10s verify=False %.3f s  verify=True %.3f s  overhead %+.1f%%  "
              "(per generate of %d forwards: CRC %.3f s, of which the forwards waited "
              "%.3f s)" % ("O_DIRECT" if direct else "page cache", off, on,
                           100 * (on / off - 1), a.tokens, statistics.median(x for x, _ in c),
                           statistics.median(y for _, y in c)), flush=True)


if __name__ == "__main__":
    main()
