"""``safetensors.torch``'s names, on nvio: code written for safetensors
switches with ``from nvio.safetensors import torch as safetensors_torch``
(or by putting this module where it imports ``safetensors.torch`` from).

Besides the load/save calls, the helpers code written for safetensors
imports from it (``storage_ptr``, ``storage_size``, ``_find_shared_tensors``,
``_is_complete``, ``_end_ptr``, ``_remove_duplicate_names``).
"""
from ._io import load, load_file, save, save_file
from ._lazy import safe_open
from ._model import load_model, save_model
from ._shared import (_end_ptr, _find_shared_tensors, _is_complete, _remove_duplicate_names,
                      storage_ptr, storage_size)

__all__ = ["load", "load_file", "save", "save_file", "load_model", "save_model", "safe_open",
           "storage_ptr", "storage_size"]
_helpers = (_end_ptr, _find_shared_tensors, _is_complete, _remove_duplicate_names)
