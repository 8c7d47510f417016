"""Inputs that must neither crash the interpreter nor mislead the caller.

Each case here was a bug found in review: object buffers taken for raw
memory, a second close() dropping buffers of running ops, a handle closed
while its arguments were converted, exceptions naming an older failure's
file or failing on non-UTF-8 names, an async op that held a tensor but not
its storage, reads that autograd did not see, packed DLPack types sized a
byte per element.
"""
import ctypes
import errno
import os
import threading
import time

import pytest

import nvio
from nvio_testutil import pattern, read_file, write_file


def test_object_buffers_refused(handle, np, tmp_path):
    path = str(tmp_path / "f")
    write_file(path, pattern(64))
    objs = np.array([object()] * 8, dtype=object)
    before = list(objs)
    for call in (lambda: handle.sync_pread(objs, path),
                 lambda: handle.sync_pwrite(objs, path),
                 lambda: nvio.buffer_info(objs, True)):
        with pytest.raises(TypeError, match="Python objects"):
            call()
    assert list(objs) == before   # the pointers are untouched
    # a structured array whose field name has an O holds data
    rec = np.zeros(4, dtype=[("Offset", "<u8")])
    handle.sync_pread(rec, path, 0)
    assert rec.tobytes() == pattern(64)[:32]
    cobjs = (ctypes.py_object * 4)(*[object()] * 4)
    with pytest.raises(TypeError, match="Python objects"):
        handle.sync_pread(cobjs, path)
    assert read_file(path) == pattern(64)


def test_non_utf8_file_names(handle, tmp_path):
    buf = bytearray(4)
    raw = os.fsencode(str(tmp_path)) + b"/missing-\xff\xfe"
    for name in (raw, os.fsdecode(raw)):
        with pytest.raises(FileNotFoundError) as ei:
            handle.sync_pread(buf, name)
        assert ei.value.errno == errno.ENOENT
        with pytest.raises(FileNotFoundError):
            handle.read(buf, name, file_offset=1)
        with pytest.raises(FileNotFoundError):
            nvio.file_size(name)


def test_errors_name_the_failing_call(handle, tmp_path):
    """Errors the binding finds itself must not borrow the handle's
    record of an older failure with the same errno."""
    buf = bytearray(4)
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    with pytest.raises(FileNotFoundError) as ei:
        handle.sync_pread(buf, first)
    assert first in str(ei.value)
    with pytest.raises(FileNotFoundError) as ei:
        handle.read(buf, second, file_offset=1)
    assert second in str(ei.value) and first not in str(ei.value)
    small, big = str(tmp_path / "small"), str(tmp_path / "big")
    write_file(small, pattern(8))
    write_file(big, pattern(100))
    with pytest.raises(OSError) as ei:
        handle.read(buf, small)
    assert ei.value.errno == errno.EOVERFLOW and small in str(ei.value)
    with pytest.raises(OSError) as ei:
        handle.read(buf, big, file_offset=10)
    assert ei.value.errno == errno.EOVERFLOW
    assert big in str(ei.value) and small not in str(ei.value)
    # a call refused for its arguments is described by its own record
    with pytest.raises(OSError) as ei:
        handle.sync_pread(buf, big, file_offset=2**63 - 2)
    assert big in str(ei.value)


def test_handle_closed_while_arguments_convert(tmp_path):
    path = str(tmp_path / "f")
    write_file(path, pattern(8))
    h = nvio.AioHandle()

    class ClosingPath:
        def __fspath__(self):
            h.close()
            return path

    with pytest.raises(ValueError, match="closed"):
        h.sync_pread(bytearray(8), ClosingPath())
    assert h.closed


def test_second_close_waits_its_turn(tmp_path):
    """While one thread's close() waits for ops in flight, another's is
    refused: it must not drop the buffers those ops still use."""
    path = str(tmp_path / "big")
    size = 16 << 20
    write_file(path, os.urandom(1 << 20) * 16)
    for attempt in range(4):
        h = nvio.AioHandle(engine="psync", block_size=4096, queue_depth=1,
                           direct=False)
        buf = bytearray(size)
        h.async_pread(buf, path)
        closer = threading.Thread(target=h.close)
        closer.start()
        while not h.closed:         # the first close has begun
            time.sleep(0.0005)
        try:
            h.close()
        except RuntimeError as e:
            assert "another thread" in str(e)
        else:
            # Right only if the first close had already ended: then the
            # read was too quick to catch; try a longer one.
            closer.join(5)
            assert not closer.is_alive(), "second close() returned early"
            size *= 2
            write_file(path, os.urandom(1 << 20) * (size >> 20))
            continue
        with pytest.raises(BufferError):   # still exported to the op
            buf[:] = b""
        closer.join()
        assert bytes(buf) == read_file(path)
        return
    pytest.skip("reads finished before a second close could be tried")


def test_async_op_holds_the_tensor_storage(engine, direct, torch, tmp_path):
    path = str(tmp_path / "f")
    n = 8 << 20
    data = os.urandom(n)
    write_file(path, data)
    h = nvio.AioHandle(engine=engine, direct=direct, block_size=65536,
                       queue_depth=2)
    t = torch.empty(n, dtype=torch.uint8)
    old = t.data_ptr()
    h.async_pread(t, path)
    t.set_(torch.empty(0, dtype=torch.uint8))   # the tensor lets go of it
    junk = [torch.ones(n, dtype=torch.uint8) for _ in range(4)]
    assert all(j.data_ptr() != old for j in junk)   # not freed, not reused
    assert h.wait() == 1
    assert all(int(j.min()) == 1 for j in junk)
    h.close()


def test_reads_bump_the_autograd_version(handle, torch, tmp_path):
    path = str(tmp_path / "f")
    write_file(path, pattern(16))
    x = torch.zeros(4)
    w = torch.ones(4, requires_grad=True)
    y = (x * w).sum()   # saves x for the backward pass
    v = x._version
    handle.sync_pread(x, path)
    assert x._version > v
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    # writes leave it alone
    v = x._version
    handle.sync_pwrite(x, path)
    assert x._version == v


class _Dev(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Dev), ("ndim", ctypes.c_int32),
                ("dtype", _DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


def test_packed_dlpack_types_are_sized_in_bits(handle, tmp_path):
    """8 int4 elements are 4 bytes: a read must not touch the 5th."""
    store = (ctypes.c_uint8 * 16)(*([0xAA] * 16))
    shape = (ctypes.c_int64 * 1)(8)
    managed = _Managed(_DLTensor(ctypes.addressof(store), _Dev(1, 0), 1,
                                 _DType(0, 4, 1), shape, None, 0), None, None)
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    class Int4:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):
            return new_capsule(ctypes.addressof(managed), b"dltensor", None)

    assert nvio.buffer_info(Int4())[1] == 4
    path = str(tmp_path / "zeros")
    write_file(path, bytes(64))
    handle.sync_pread(Int4(), path)
    assert bytes(store) == bytes(4) + b"\xaa" * 12


def test_small_input_mistakes():
    assert nvio.strerror(2**32 + 2) != nvio.strerror(2)
    with pytest.raises(ValueError, match="engine"):
        nvio.AioHandle(engine="psync\0junk")


def test_duck_typed_tensor_without_devices(handle, np, tmp_path):
    """An object with the tensor methods but no is_cpu/device is host memory."""
    path = str(tmp_path / "f")
    write_file(path, pattern(32))
    arr = np.zeros(32, np.uint8)

    class Duck:
        def data_ptr(self):
            return arr.ctypes.data

        def element_size(self):
            return 1

        def is_contiguous(self):
            return True

        def numel(self):
            return 32

    handle.sync_pread(Duck(), path)
    assert arr.tobytes() == pattern(32)
