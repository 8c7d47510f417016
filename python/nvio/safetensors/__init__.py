"""nvio.safetensors: safetensors files read and written at the device's speed.

    from nvio import safetensors as nst
    sd = nst.load_file("model.safetensors")           # like safetensors.torch
    nst.save_file(sd, "copy.safetensors")             # same bytes, crash-safe
    with nst.safe_open("model.safetensors") as f:     # lazy: only what you ask
        w = f.get_slice("lm_head.weight")[:1024]
    sd = nst.load_model_dir("llama/")                 # sharded HF directories
    nst.load_into(model, "llama/")                    # in place, no 2nd copy
    for name, t in nst.iter_tensors("llama/", window_bytes=1 << 30): ...
    model = nst.from_pretrained(AutoModelForCausalLM, "llama/")
    nst.save_model(model, "m.safetensors")            # tied weights saved once
    from nvio.safetensors import numpy as nst_np      # NumPy arrays, same files

``nvio.safetensors.torch`` and ``nvio.safetensors.numpy`` hold the names of
``safetensors.torch`` and ``safetensors.numpy``; safetensors' own test
suite passes with them in its place (tests/peers/safetensors_suite.py).

Same arguments, results and files as the safetensors library
(``safetensors.torch``); nvio's additions are keyword-only. Malformed files
raise :class:`SafetensorsError` (a ValueError, and the library's
SafetensorError when it is installed) naming the file and the tensor.
"""
from ._dir import iter_tensors, load_into, load_model_dir
from .._base.stformat import DTYPES, MAX_HEADER, SafetensorsError
from ._hf import from_pretrained
from ._io import load, load_file, save, save_file
from ._lazy import safe_open
from ._model import load_model, save_model
from .. import _renamed

__all__ = ["load_file", "load", "save_file", "save", "safe_open", "load_model", "save_model",
           "load_model_dir", "load_into", "iter_tensors", "from_pretrained", "SafetensorsError",
           "DTYPES", "MAX_HEADER"]

# 0.3: stream -> iter_tensors (issue 31, one meaning per name); warns once.
__getattr__ = _renamed.renamed(__name__, {"stream": "iter_tensors"}, globals())
