"""nvio._base: the tensor-I/O base under nvio's Python applications.

The applications (checkpoint, dcp, safetensors, offload, data,
integrations, compat and the DeepSpeed writers in _filewriters) import
from here, from nvio's core layer (nvio, nvio.handles, nvio.io,
nvio._nvio, nvio._futures, nvio._device, nvio._regular, nvio._atomic)
and from their own private modules; never from another application's
private module (tests/py/test_import_graph.py checks it). Nothing here
imports an application.

Modules, by topic (import the module you need; this package imports
none of them, so that each stays as light as its own imports):

- handle: the default throughput handle (and NVIO_DIRECT, read once).
- views: byte views of tensors and storages, numel.
- pieces: vectored reads and writes of tensor pieces, host memory for
  O_DIRECT (aligned, locked).
- space: space reservation, the flags of an atomic (crash-safe) file.
- crc: the CRC pool (crc_submit), CRC-32 of device memory.
- group: the torch.distributed group helper (steps that name dead ranks).
- plan: a torch.save file image laid out (Plan, CheckpointError), and
  written window by window (write_images, ImageStream, packs).
- torchzip: the zip records of torch's file format.
- stformat: the safetensors format (header, dtypes, a model directory's
  index).
- pickles: the one Python pickle allowlist (a gate run before unpickling;
  why it is not _nvio.pickle_scan is in its docstring).
"""
