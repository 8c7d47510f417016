"""Hugging Face transformers: from_pretrained with weights read by nvio.

transformers (5.x) takes a ready state dict in ``from_pretrained(None,
config=..., state_dict=...)``: the model is built from the directory's
config, the state dict comes from :func:`load_model_dir`, and transformers
does everything else (tied weights, dtype, device_map) as usual. Nothing in
transformers is patched.
"""
from __future__ import annotations

import os

from ._dir import load_model_dir


def from_pretrained(model_class, path, *, device="cpu", pin_memory=None, handle=None, **kwargs):
    """``model_class.from_pretrained(path, **kwargs)`` for a local model
    directory, its safetensors read by nvio (:func:`load_model_dir`).

    ``model_class``: a transformers model class or Auto class (e.g.
    ``AutoModelForCausalLM``). ``config`` in kwargs wins over the
    directory's config.json. Other kwargs go to ``from_pretrained``.
    """
    path = os.fsdecode(path)
    if not os.path.isdir(path):
        raise NotADirectoryError(20, "nvio.safetensors.from_pretrained: a local model "
                                 "directory is needed (nothing is downloaded)", path)
    config = kwargs.pop("config", None)
    if config is None:
        from transformers import AutoConfig
        config = AutoConfig.from_pretrained(path)
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is not None:             # an Auto class: the concrete class for this config
        try:
            model_class = mapping[type(config)]
        except KeyError:
            raise ValueError("nvio.safetensors.from_pretrained: %s has no model for a %s"
                             % (model_class.__name__, type(config).__name__)) from None
    sd = load_model_dir(path, device=device, pin_memory=pin_memory, handle=handle)
    return model_class.from_pretrained(None, config=config, state_dict=sd, **kwargs)
