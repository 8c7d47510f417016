"""The tests' own equality helper (nvio_testutil.same): fast, and still
failing on one flipped bit anywhere it looks."""
import pytest

from nvio_testutil import byte_view, same, storage_bytes

torch = pytest.importorskip("torch")


def dtypes():
    out = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
           torch.uint8, torch.int16, torch.int64, torch.bool, torch.complex64,
           torch.complex128]
    return out + [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "uint32")
                  if hasattr(torch, n)]


def rand(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw &= 1
    return raw.view(dtype).reshape(shape)


def flipped(t, byte, bit):
    """A copy of t with one bit of its element bytes flipped (for bool: the
    whole value, the one bit a bool has)."""
    u = t.clone()
    v = u.view(torch.uint8).view(-1) if u.dim() else u.reshape(1).view(torch.uint8)
    v[byte] ^= 1 if t.dtype == torch.bool else 1 << bit
    return u


def fails(a, b, **kw):
    with pytest.raises(AssertionError):
        same(a, b, **kw)
    return True


@pytest.mark.parametrize("dtype", dtypes(), ids=str)
@pytest.mark.parametrize("layout", [False, True])
def test_one_flipped_bit_fails_for_every_dtype(dtype, layout):
    t = rand(dtype, (5, 7), 1)
    assert same(t, t.clone(), layout=layout)
    nbytes = t.numel() * t.element_size()
    for byte in (0, nbytes // 2, nbytes - 1):
        for bit in (0, 7):
            assert fails({"x": [t]}, {"x": [flipped(t, byte, bit)]}, layout=layout)


def test_views_and_non_contiguous_tensors():
    base = rand(torch.float32, (40, 40), 2)
    for view in (base[::2, 1::3], base.t(), base[3], base[:, 5]):
        assert same(view, view.clone())        # by value: strides may differ
        other = base.clone()
        other.view(-1).view(torch.int32)[view.storage_offset()] ^= 1    # its first element
        assert fails(view, other.as_strided(view.shape, view.stride(), view.storage_offset()))
    # layout=True: the strides, and the bytes outside the view, count
    v = base[::2]
    assert fails(v, v.contiguous(), layout=True)
    other = base.clone()
    other.view(torch.int32)[1, 0] ^= 1          # a row the view skips
    assert same(v, other[::2])
    assert fails(v, other[::2], layout=True)


def test_special_values_are_bits():
    nan = torch.tensor([float("nan"), -0.0, float("inf")])
    assert same(nan, nan.clone())               # the same NaN: equal (torch.equal says no)
    assert fails(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert same(torch.tensor(3.5), torch.tensor(3.5))
    assert fails(torch.tensor(3.5), torch.tensor(3.25))
    assert same(torch.empty(0, 5), torch.empty(0, 5))
    assert fails(torch.empty(0, 5), torch.empty(5, 0))


def test_dtype_shape_type_and_structure():
    t = torch.arange(6, dtype=torch.int32)
    assert fails(t, t.view(torch.float32))      # the same bytes, another dtype
    assert fails(t, t.reshape(2, 3))
    assert fails(t, t.to(torch.int64))
    p = torch.nn.Parameter(t.float())
    assert same(p, t.float()) and fails(p, t.float(), layout=True)
    assert fails({"a": t}, {"b": t}) and fails([t], [t, t]) and fails({"n": 1}, {"n": 2})
    assert same({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert fails({"a": 1, "b": 2}, {"b": 2, "a": 1}, ordered=True)
    assert fails((1, 2), [1, 2], layout=True)


def test_conj_neg_quantized_sparse_meta_storage():
    c = rand(torch.complex64, (6,), 3)
    assert same(c.conj(), c.conj().resolve_conj()) and fails(c.conj(), c)
    q = torch.quantize_per_tensor(torch.randn(10), 0.1, 3, torch.qint8)
    assert same(q, q.clone())
    s = torch.sparse_coo_tensor([[0, 2]], torch.tensor([1.0, 2.0]), (4,))
    assert same(s, s.clone())
    assert fails(s, torch.sparse_coo_tensor([[0, 2]], torch.tensor([1.0, 2.5]), (4,)))
    m = torch.empty(3, 4, device="meta")
    assert byte_view(m) is None and same(m, torch.empty(3, 4, device="meta"))
    assert fails(m, torch.empty(4, 3, device="meta"))
    assert fails(m, torch.empty(3, 4))
    u = torch.arange(10, dtype=torch.int32).untyped_storage()
    v = torch.arange(10, dtype=torch.int32)
    v[9] ^= 1 << 30
    assert same(u, torch.arange(10, dtype=torch.int32).untyped_storage())
    assert fails(u, v.untyped_storage())
    assert storage_bytes(u).numel() == 40


def test_big_tensors_are_quick():
    """The point of the helper: 16 MiB compared in well under a second on
    an idle machine (bytes(untyped_storage) takes seconds per MiB); the
    bound leaves room for a busy one."""
    import time
    t = rand(torch.float32, (4 << 20,), 4)
    u = t.clone()
    t0 = time.monotonic()
    assert same({"t": t}, {"t": u}, layout=True) and same(t[::3], u[::3])
    assert time.monotonic() - t0 < 10
    u[-1] = -u[-1] if u[-1] == u[-1] else 1.0
    with pytest.raises(AssertionError, match="byte %d" % (t.numel() * 4 - 1)):
        same(t, u)
