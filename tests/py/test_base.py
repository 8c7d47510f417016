"""nvio._base, the tensor-I/O base: the one byte view, numel, the one
throughput handle and NVIO_DIRECT read once, used by every application."""
import pytest

torch = pytest.importorskip("torch")

from nvio._base import handle as base_handle  # noqa: E402
from nvio._base.views import numel, tensor_u8, u8  # noqa: E402


def test_u8_is_every_byte_of_a_storage_without_a_copy():
    t = torch.arange(10, dtype=torch.int32)
    b = u8(t.untyped_storage())
    assert b.dtype == torch.uint8 and b.numel() == 40
    assert bytes(b.numpy()) == t.numpy().tobytes()
    b[0] = 7                                    # a view: writes land in t
    assert t[0].item() == 7


@pytest.mark.parametrize("make", [
    lambda: torch.arange(24, dtype=torch.float64).reshape(4, 6)[1:3],   # storage offset
    lambda: torch.tensor(3.5),                                          # 0-d
    lambda: torch.empty(0, 5),                                          # empty
    lambda: torch.nn.Parameter(torch.randn(3, 4)),                      # requires grad
    lambda: torch.arange(8, dtype=torch.int16)[2:],                     # odd offset
])
def test_tensor_u8_is_exactly_the_tensors_bytes(make):
    t = make()
    b = tensor_u8(t)
    assert b.dtype == torch.uint8 and b.dim() == 1 and not b.requires_grad
    assert b.numel() == t.numel() * t.element_size()
    assert bytes(b.numpy()) == t.detach().contiguous().numpy().tobytes()
    if t.numel():
        assert b.data_ptr() == t.data_ptr()     # no copy


def test_numel():
    assert numel(()) == 1 and numel((0, 5)) == 0 and numel(torch.Size([3, 4, 5])) == 60


def test_one_default_handle_for_every_application():
    import nvio.checkpoint
    from nvio.safetensors import _io
    h = base_handle.default_handle()
    assert nvio.checkpoint.default_handle() is h and _io.default_handle() is h
    assert h.get_block_size() == base_handle.BLOCK_SIZE
    assert h.get_queue_depth() == base_handle.QUEUE_DEPTH


@pytest.mark.parametrize("env,want", [("", (None, "")), ("auto", (None, "")),
                                      ("AUTO", (None, "")), ("on", (True, "on")),
                                      ("1", (True, "1")), ("off", (False, "off")),
                                      ("No", (False, "No")), ("false", (False, "false"))])
def test_env_direct(monkeypatch, env, want):
    monkeypatch.setenv("NVIO_DIRECT", env)
    assert base_handle.env_direct() == want
