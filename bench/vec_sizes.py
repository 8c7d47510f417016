#!/usr/bin/env python3
"""bench/vec_sizes.py - a reproducible list of ~10,000 piece sizes (~2 GiB)
drawn from a real transformer state dict, for the vectored I/O benchmark.

The model is Llama-like (TinyLlama-1.1B's shape): hidden 2048, 22 layers,
32 heads of 64 with 4 key/value heads (grouped-query attention),
intermediate 5632, vocab 32000, untied lm_head, bf16 (2 bytes). Its state
dict, in the order torch would save it:

  model.embed_tokens.weight                 32000 x 2048
  per layer: q_proj 2048x2048, k_proj 256x2048, v_proj 256x2048,
             o_proj 2048x2048, gate_proj 5632x2048, up_proj 5632x2048,
             down_proj 2048x5632, input_layernorm 2048,
             post_attention_layernorm 2048
  model.norm.weight 2048; lm_head.weight 32000 x 2048

201 tensors, 2,200,048,640 bytes. To reach ~10,000 pieces every tensor is
split along its first dimension into SHARDS (default 50) near-equal parts
(numpy.array_split's rule: the first `n % SHARDS` parts get one more row),
as a 50-way row-sharded (tensor-parallel or FSDP-flattened) checkpoint
lays them out: 10,050 pieces from 2.6 MB (embedding rows) down to 80 bytes
(norm slices), most of them not multiples of 4 KiB in total offset since
the norm slices shift everything after them. A last padding piece makes the
file a multiple of 16 MiB so fio (with 2 jobs of up to 8 MiB blocks) moves
exactly the same bytes.

    python3 bench/vec_sizes.py > sizes.txt        # one size per line
    python3 bench/vec_sizes.py --summary
"""
import argparse
import sys


def state_dict(hidden=2048, layers=22, heads=32, kv_heads=4, inter=5632, vocab=32000,
               dtype_bytes=2):
    hd = hidden // heads
    t = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = "model.layers.%d." % i
        t += [(p + "self_attn.q_proj.weight", (heads * hd, hidden)),
              (p + "self_attn.k_proj.weight", (kv_heads * hd, hidden)),
              (p + "self_attn.v_proj.weight", (kv_heads * hd, hidden)),
              (p + "self_attn.o_proj.weight", (hidden, heads * hd)),
              (p + "mlp.gate_proj.weight", (inter, hidden)),
              (p + "mlp.up_proj.weight", (inter, hidden)),
              (p + "mlp.down_proj.weight", (hidden, inter)),
              (p + "input_layernorm.weight", (hidden,)),
              (p + "post_attention_layernorm.weight", (hidden,))]
    t += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return t, dtype_bytes


def pieces(shards=50, pad_to=16 << 20, **cfg):
    tensors, b = state_dict(**cfg)
    out = []
    for name, shape in tensors:
        rows = shape[0]
        per_row = b
        for d in shape[1:]:
            per_row *= d
        q, r = divmod(rows, shards)
        for k in range(shards):
            n = q + (1 if k < r else 0)
            if n:
                out.append(n * per_row)
    total = sum(out)
    if pad_to and total % pad_to:
        out.append(pad_to - total % pad_to)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=50)
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--summary", action="store_true")
    a = ap.parse_args()
    s = pieces(shards=a.shards, layers=a.layers)
    if a.summary:
        import collections
        tot = sum(s)
        print("%d pieces, %d bytes (%.2f GiB); min %d, max %d, median %d" % (
            len(s), tot, tot / 2**30, min(s), max(s), sorted(s)[len(s) // 2]))
        print("pieces < 4 KiB: %d; multiples of 4 KiB: %d" % (
            sum(x < 4096 for x in s), sum(x % 4096 == 0 for x in s)))
        for size, n in sorted(collections.Counter(s).items()):
            print("  %10d x %d" % (size, n))
        return
    sys.stdout.write("".join("%d\n" % x for x in s))


if __name__ == "__main__":
    main()
