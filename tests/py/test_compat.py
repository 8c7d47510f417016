"""nvio.compat: DeepSpeed DeepNVMe code runs with an import change."""
import gc
import os
import weakref

import pytest

import nvio
from nvio.compat import (AsyncIOBuilder, GDSBuilder, PinMemoryBuilder, UtilsBuilder,
                         cast_to_byte_tensor)
from nvio_testutil import read_file


def test_async_io_builder(torch, tmp_path):
    assert AsyncIOBuilder().is_compatible() is True
    mod = AsyncIOBuilder().load()
    h = mod.aio_handle(block_size=1048576, queue_depth=32, single_submit=False,
                       overlap_events=True, intra_op_parallelism=2)
    assert isinstance(h, nvio.AioHandle)
    assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(),
            h.get_overlap_events(), h.get_intra_op_parallelism()) == (1048576, 32, False,
                                                                        True, 2)
    assert h.get_alignment() == 1024
    f = str(tmp_path / "test_1MB.pt")
    t = torch.randint(0, 255, (1 << 20,), dtype=torch.uint8)
    # The tutorial's calls, verbatim apart from the import.
    h.sync_pwrite(t, f)
    assert read_file(f) == bytes(t.numpy())
    h.async_pwrite(t, f)
    assert h.wait() == 1
    u = torch.empty_like(t)
    h.async_pread(u, f)
    assert h.wait() == 1
    assert torch.equal(t, u)
    locked = h.new_cpu_locked_tensor(1 << 20, torch.Tensor().to(torch.uint8))
    assert h.sync_pread(locked, f) == 1 and torch.equal(locked, t)
    assert h.free_cpu_locked_tensor(locked)
    assert mod.aio_write(t, f, 1048576, 128, False, False, False) == 0
    v = torch.empty_like(t)
    assert mod.aio_read(v, f, 1048576, 128, False, False, True) == 0
    assert torch.equal(v, t)
    assert mod.deepspeed_memcpy(v, torch.zeros_like(v)) == 0 and int(v.sum()) == 0


def test_tab_completion_names():
    h = AsyncIOBuilder().load().aio_handle()
    for name in ("async_pread", "async_pwrite", "free_cpu_locked_tensor", "get_block_size",
                 "get_intra_op_parallelism", "get_overlap_events", "get_queue_depth",
                 "get_single_submit", "new_cpu_locked_tensor", "pread", "pwrite", "read",
                 "sync_pread", "sync_pwrite", "wait", "write"):
        assert name in dir(h)


def test_gds_builder_gives_a_working_gds_handle(tmp_path):
    """gds_handle works everywhere: without usable cuFile (as here) it says
    so and moves host buffers like aio_handle, bytes intact."""
    import nvio
    h = GDSBuilder().load().gds_handle(intra_op_parallelism=2)
    assert isinstance(h, nvio.GdsHandle)
    mode, why = nvio.gds_mode()
    assert mode in ("direct", "compat", "none") and why
    assert h.uses_gds() == (mode != "none")
    data = bytearray(os.urandom(100_003))
    h.sync_pwrite(data, str(tmp_path / "g.bin"))
    out = bytearray(len(data))
    h.sync_pread(out, str(tmp_path / "g.bin"))
    assert out == data


def test_pin_memory_builder(torch):
    ph = PinMemoryBuilder().load().pin_handle()
    t = ph.new_cpu_locked_tensor(100, torch.empty(0, dtype=torch.float16))
    assert t.dtype == torch.float16 and ph.is_pinned(t) in (True, False)
    assert ph.free_cpu_locked_tensor_by_ptr(t.data_ptr())
    assert not ph.free_cpu_locked_tensor(t)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "bool", "int64", "float16",
                                   "uint8", "complex64", "float64"])
def test_cast_to_byte_tensor(torch, dtype):
    dt = getattr(torch, dtype)
    src = torch.ones(3, 5, dtype=dt)
    b = UtilsBuilder().load().cast_to_byte_tensor(src)
    assert b.dtype == torch.uint8 and b.dim() == 1
    assert b.numel() == src.numel() * src.element_size()
    assert b.data_ptr() == src.data_ptr()                   # zero-copy


def test_cast_to_byte_tensor_keeps_source_alive(torch):
    src = torch.arange(1000, dtype=torch.float32)
    expect = bytes(src.view(torch.uint8).numpy())
    ref = weakref.ref(src)
    b = cast_to_byte_tensor(src)
    del src
    gc.collect()
    assert bytes(b.numpy()) == expect                      # still valid memory
    del b
    gc.collect()
    assert ref() is None


def test_cast_to_byte_tensor_list_and_errors(torch, np):
    ts = [torch.ones(4, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int32),
          torch.tensor(3.0)]
    bs = cast_to_byte_tensor(ts)
    assert [b.numel() for b in bs] == [8, 8, 4]
    with pytest.raises(ValueError, match="contiguous"):
        cast_to_byte_tensor(torch.ones(4, 4).t())
    a = cast_to_byte_tensor(np.ones(3, np.float32))
    assert a.dtype == np.uint8 and a.size == 12
