"""Thin adapters that put nvio under frameworks users already run.

Each submodule imports its framework, so none is imported by ``import nvio``
or by this package; install the extra first (``pip install "nvio[lightning]"``,
``"nvio[transformers]"``, ``"nvio[deepspeed]"``):

- :mod:`nvio.integrations.lightning`: ``NvioCheckpointIO``, a Lightning
  ``CheckpointIO`` plugin saving through ``nvio.save``, loading through
  ``nvio.load``.
- :mod:`nvio.integrations.transformers`: ``NvioCheckpointCallback`` /
  ``use_nvio(trainer)``: Hugging Face ``Trainer`` checkpoints written and read
  through nvio.
- :mod:`nvio.integrations.deepspeed`: ``use_nvio()``: DeepSpeed's NVMe offload,
  FastPersist writers and ds_io on nvio's ``AsyncIOBuilder``; removable.
"""
