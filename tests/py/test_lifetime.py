"""Buffer and handle lifetimes: nothing is freed under the kernel."""
import gc
import os
import weakref

import pytest

import nvio
from nvio_testutil import pattern, read_file, write_file


def test_del_tensor_after_async_pwrite(handle, torch, tmp_path):
    f = tmp_path / "del.bin"
    data = pattern((4 << 20) + 3, 1)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    ref = weakref.ref(t)
    assert handle.async_pwrite(t, str(f)) == 0
    del t
    gc.collect()
    if handle.pending():
        assert ref() is not None              # the handle keeps it alive
    assert handle.wait() == 1
    gc.collect()
    assert ref() is None                      # ... and lets it go after wait()
    assert read_file(f) == data


def test_del_array_after_async_pread(handle, np, tmp_path):
    f = tmp_path / "r.bin"
    data = pattern(3 << 20, 2)
    write_file(f, data)
    a = np.zeros(len(data), np.uint8)
    ref = weakref.ref(a)
    view = memoryview(a)                      # a second way to look at the bytes
    handle.async_pread(a, str(f))
    del a
    gc.collect()
    assert handle.wait() == 1
    assert bytes(view) == data
    view.release()
    gc.collect()
    assert ref() is None


def test_buffers_released_when_wait_raises(np):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with nvio.AioHandle(engine="psync", direct=False) as h:
        a = np.ones(1000, np.uint8)
        ref = weakref.ref(a)
        h.async_pwrite(a, "/dev/full")
        del a
        with pytest.raises(nvio.NvioError):
            h.wait()
        gc.collect()
        assert ref() is None


def test_rejected_async_op_holds_nothing(handle, np, tmp_path):
    a = np.zeros(10, np.uint8)
    ref = weakref.ref(a)
    with pytest.raises(FileNotFoundError):
        handle.async_pread(a, str(tmp_path / "missing"))
    del a
    gc.collect()
    assert ref() is None


def test_gc_of_handle_with_pending_ops(engine, direct, torch, tmp_path):
    srcs = [torch.frombuffer(bytearray(pattern((1 << 20) + i, i)), dtype=torch.uint8)
            for i in range(6)]
    expect = [bytes(t.numpy()) for t in srcs]
    refs = [weakref.ref(t) for t in srcs]
    h = nvio.AioHandle(engine=engine, direct=direct, queue_depth=2, block_size=65536)
    for i, t in enumerate(srcs):
        h.async_pwrite(t, str(tmp_path / f"g{i}"))
    del srcs, t
    del h                                     # dealloc waits for the ops in flight
    gc.collect()
    assert all(r() is None for r in refs)
    for i, data in enumerate(expect):
        assert read_file(tmp_path / f"g{i}") == data


def test_close_with_pending_ops(np, tmp_path):
    data = pattern(2 << 20, 7)
    a = np.frombuffer(data, np.uint8).copy()
    h = nvio.AioHandle()
    h.async_pwrite(a, str(tmp_path / "c.bin"))
    h.close()
    assert read_file(tmp_path / "c.bin") == data


def test_locked_tensor_freed_once(torch):
    h = nvio.AioHandle()
    t = h.new_cpu_locked_tensor(1 << 16, torch.empty(0, dtype=torch.float32))
    assert t.dtype == torch.float32 and t.shape == (1 << 16,)
    assert t.data_ptr() % 4096 == 0
    addr = t.data_ptr()
    assert nvio._nvio.mem_query(addr, t.nbytes) & nvio._nvio.MEM_NVIO
    assert h.is_pinned(t) == bool(nvio._nvio.mem_query(addr, 1) & nvio._nvio.MEM_LOCKED)
    assert torch.count_nonzero(t) == 0                 # zeroed
    view = t[100:200]
    assert h.free_cpu_locked_tensor(t) is True
    assert h.free_cpu_locked_tensor(t) is False        # a second free is a no-op
    del t
    gc.collect()
    # A view still uses the memory: it must not have been freed.
    assert nvio._nvio.mem_query(addr, 1) & nvio._nvio.MEM_NVIO
    view.fill_(3.0)
    assert float(view.sum()) == 300.0
    del view
    gc.collect()
    assert nvio._nvio.mem_query(addr, 1) == 0           # freed now, exactly once
    h.close()


def test_locked_tensor_forgotten(torch):
    h = nvio.AioHandle()
    t = h.new_cpu_locked_tensor(1000, torch.empty(0, dtype=torch.bfloat16))
    addr = t.data_ptr()
    del h                                              # never freed by the user
    gc.collect()
    assert nvio._nvio.mem_query(addr, 1) & nvio._nvio.MEM_NVIO
    t.fill_(1)
    del t
    gc.collect()
    assert nvio._nvio.mem_query(addr, 1) == 0


def test_locked_tensor_dtypes_and_numpy(torch, np):
    with nvio.AioHandle() as h:
        for dt in (torch.bool, torch.bfloat16, torch.float16, torch.int64,
                   torch.complex128, torch.uint8):
            t = h.new_cpu_locked_tensor(17, torch.empty(1, dtype=dt))
            assert t.dtype == dt and t.numel() == 17
            assert h.free_cpu_locked_tensor(t)
        z = h.new_cpu_locked_tensor(0, torch.empty(1))
        assert z.numel() == 0
        a = h.new_cpu_locked_tensor(10, np.zeros(1, np.float64))
        assert a.dtype == np.float64 and a.shape == (10,) and a.flags.writeable
        assert h.free_cpu_locked_tensor(a)
        with pytest.raises(TypeError):
            h.new_cpu_locked_tensor(10, "float32")
        with pytest.raises(ValueError):
            h.new_cpu_locked_tensor(-1, torch.empty(1))
        with pytest.raises(TypeError):
            h.new_cpu_locked_tensor(1.5, torch.empty(1))


def test_locked_buffer_direct_use():
    b = nvio.LockedBuffer(10000)
    assert b.nbytes == 10000 and len(b) == 10000 and b.address % 4096 == 0
    m = memoryview(b)
    m[0] = 7
    addr = b.address
    del b
    gc.collect()
    assert m[0] == 7                                    # alive through the view
    m.release()
    gc.collect()
    assert nvio._nvio.mem_query(addr, 1) == 0
    assert len(nvio.LockedBuffer(0)) == 0
    with pytest.raises(ValueError):
        nvio.LockedBuffer(-1)


def test_many_handles_and_cycles(np, tmp_path):
    a = np.arange(1000, dtype=np.uint8)
    for i in range(50):
        h = nvio.AioHandle(engine="psync")
        h.async_pwrite(a, str(tmp_path / "m.bin"))
        if i % 2:
            h.wait()
    del h
    gc.collect()
    assert read_file(tmp_path / "m.bin") == a.tobytes()
