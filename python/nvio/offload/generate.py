"""python -m nvio.offload.generate: greedy generation, the weights read from disk.

    python -m nvio.offload.generate --config /nvme/llama --prompt "Hello" --tokens 32

``--config``: a ``save_pretrained`` directory (its safetensors are read
in place; the model is built on the meta device, so its weights are never
all in memory), or a config (a directory with only config.json, or a JSON
file): then the model gets random weights in memory and nvio writes its
weight store to ``--dir`` once. The prompt goes through the directory's
tokenizer when it has one, else it becomes token ids (its UTF-8 bytes
modulo the vocabulary). Prints the tokens, tokens/s, the weight bytes read
and the GB/s achieved, peak resident weight memory as stated by the
runner, the process's peak RSS, and whether blocks were read with O_DIRECT
or through the page cache, and why (``--direct auto|on|off``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _peak_rss():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _build(path, seed):
    import torch
    import transformers
    cfg_path = path if os.path.isfile(path) else os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise SystemExit("nvio: %s: no config.json" % path)
    from ._trust import open_regular    # imports torch: not before --help is answered
    with open_regular(cfg_path, "r", lambda msg, field=None: SystemExit("nvio: " + msg)) as f:
        d = json.load(f)
    cfg = transformers.AutoConfig.for_model(**d)
    has_weights = os.path.isdir(path) and any(n.endswith(".safetensors") for n in os.listdir(path))
    if has_weights:
        import accelerate
        with accelerate.init_empty_weights(include_buffers=False):
            m = transformers.AutoModelForCausalLM.from_config(cfg)
    else:
        torch.manual_seed(seed)
        m = transformers.AutoModelForCausalLM.from_config(cfg)
    return m.eval(), cfg, has_weights


def _prompt_ids(path, prompt, vocab, batch):
    import torch
    tok = None
    if os.path.isdir(path):
        try:
            import transformers
            tok = transformers.AutoTokenizer.from_pretrained(path)
        except Exception:  # noqa: BLE001  (no tokenizer files: use bytes)
            tok = None
    if tok is not None:
        ids = tok(prompt, return_tensors="pt").input_ids
    else:
        ids = torch.tensor([[b % vocab for b in prompt.encode()] or [0]])
    return ids.repeat(batch, 1), tok


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m nvio.offload.generate",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="save_pretrained directory or config")
    ap.add_argument("--prompt", default="The quick brown fox")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dir", default=None, help="where nvio's weight store goes when needed")
    ap.add_argument("--prefetch", type=int, default=1)
    ap.add_argument("--pool-bytes", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--direct", choices=("auto", "on", "off"), default="auto",
                    help="O_DIRECT reads (on), the page cache (off), or let nvio decide")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    from . import run_from_disk         # nvio.offload imports torch (see above)
    m, cfg, has_weights = _build(a.config, a.seed)
    store = a.config if has_weights else a.dir
    if store is None:
        raise SystemExit("nvio: %s holds no weights: give --dir for nvio's weight store" % a.config)
    t0 = time.perf_counter()
    run_from_disk(m, store, device=a.device, prefetch=a.prefetch, pool_bytes=a.pool_bytes,
                  direct=a.direct)
    setup = time.perf_counter() - t0
    s = m._nvio_from_disk
    ids, tok = _prompt_ids(a.config, a.prompt, cfg.vocab_size, a.batch)
    ids = ids.to(a.device)
    read0 = s.stats()["bytes_read"]
    t0 = time.perf_counter()
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=a.tokens, min_new_tokens=a.tokens,
                         do_sample=False, pad_token_id=0)
    dt = time.perf_counter() - t0
    st = s.stats()
    new = out[0, ids.shape[1]:].tolist()
    text = tok.decode(new) if tok is not None else " ".join(map(str, new))
    print("tokens: %s" % text)
    gb = (st["bytes_read"] - read0) / 1e9
    print("%d x %d tokens in %.2f s: %.2f tokens/s; %.2f GB of weights read, %.2f GB/s; "
          "setup %.2f s (source: %s)" % (a.batch, a.tokens, dt, a.batch * a.tokens / dt, gb,
                                          gb / dt if dt else 0.0, setup, st["source"]))
    print("peak resident weight memory: %.3f GB (resident %.3f GB + pool %d x %.3f GB); "
          "streamed weights %.3f GB; peak RSS %.3f GB; time waiting for reads %.2f s" % (
              st["peak_weight_bytes"] / 1e9, st["resident_bytes"] / 1e9, st["slots"],
              st["slot_bytes"] / 1e9, st["streamed_bytes"] / 1e9, _peak_rss() / 1e9,
              st["wait_s"]))
    print("reads: %s (%s)" % ("O_DIRECT" if st["o_direct"] else "through the page cache",
                              st["why"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
