"""nvio.data: training data at the device's speed.

Random-access sample reading for the loaders people use:

* :class:`IndexedDataset`: Megatron's ``.idx``/``.bin`` (every dtype,
  document and sequence indices, multimodal), megatron's access methods,
  the same arrays bit for bit;
* :class:`TokenWindows`: flat token files (nanoGPT's raw uint16, llm.c's
  headered uint16/uint32): windows of ``seq_len + 1`` tokens;
* batches as ONE vectored submission at high queue depth into one buffer,
  the samples views of it (``read_batch``, ``__getitems__`` for torch's
  DataLoader with ``collate_fn=collate``), read ahead by
  :class:`BatchLoader` from the main process, or read in DataLoader
  workers (fork or spawn: each worker opens its own handle);
* ``nvio.data.megatron``: Megatron's own GPTDataset / BlendedDataset over
  nvio (imports megatron.core; nothing here does).

Importing this package registers nothing and imports neither torch nor
megatron.
"""
from ._datasets import IndexedDataset, TokenWindows, token_layout
from ._errors import (DataError, DataFormatError, DataReadError, DataTruncatedError,
                      SampleIndexError, SampleTypeError)
from ._loader import BatchLoader, collate
from ._read import choose_direct, plan_lanes, plan_reads

__all__ = ["IndexedDataset", "TokenWindows", "BatchLoader", "collate", "DataError",
           "DataFormatError", "DataTruncatedError", "DataReadError", "SampleIndexError",
           "SampleTypeError",
           "choose_direct", "plan_lanes", "plan_reads", "token_layout"]
