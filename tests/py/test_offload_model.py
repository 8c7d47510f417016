"""nvio.offload.offload_model: a small transformer trained with its parameters
and gradients on NVMe (and its optimizer state, through NVMeOptimizer) gives
the losses and parameters of in-memory training, on every engine."""
import copy
import os
import subprocess
import sys

import pytest

import nvio

torch = pytest.importorskip("torch")
from nvio.offload import NVMeOptimizer, offload_model  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Tiny(torch.nn.Module):
    def __init__(self, vocab=64, d=32, layers=3, heads=4, ctx=16):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(ctx, d) * 0.02)   # the root's own
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def data(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 64, (4, 16), generator=g) for _ in range(n)]


def step(model, opt, x, micro=1):
    opt.zero_grad()
    total = 0.0
    for xm in x.chunk(micro):
        logits = model(xm[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), xm[:, 1:].reshape(-1))
        (loss / micro).backward()
        total += loss.item()
    opt.step()
    return total


def test_training_equals_in_memory(engine, tmp_path):
    torch.manual_seed(0)
    a = Tiny()
    b = copy.deepcopy(a)
    ref = torch.optim.AdamW(a.parameters(), lr=3e-3)
    om = offload_model(b, str(tmp_path), engine=engine)
    assert all(p.numel() == 0 for p in b.parameters())          # nothing resident
    opt = NVMeOptimizer(torch.optim.AdamW(b.parameters(), lr=3e-3), str(tmp_path),
                        sub_group_numel=5000, engine=engine)
    assert opt._model is om and len(opt._subgroups) > 3
    la, lb = [], []
    for i, x in enumerate(data(20)):
        micro = 2 if i % 5 == 4 else 1                          # accumulation too
        la.append(step(a, ref, x, micro))
        lb.append(step(b, opt, x, micro))
        assert all(p.numel() == 0 for p in b.parameters()), i
        assert all(p.grad is None for p in b.parameters()), i   # grads went to NVMe
    assert la == lb
    # eval under no_grad works too, and equals
    with torch.no_grad():
        assert torch.equal(a(data(1, 9)[0]), b(data(1, 9)[0]))
    om.remove()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert [n for n, _ in a.named_parameters()] == [n for n, _ in b.named_parameters()]
    assert not b._forward_pre_hooks and not b.blocks[0]._forward_hooks
    opt.close()


def test_pool_holds_units_not_the_model(tmp_path):
    """The swapper's pool is sized by the largest unit and the prefetch depth;
    a model of many blocks still runs in it."""
    torch.manual_seed(0)
    m = Tiny(layers=24)
    x = data(2)
    total = sum(p.numel() * p.element_size() for p in m.parameters())
    om = offload_model(m, str(tmp_path), prefetch=1)
    assert om.swapper.pool_bytes < total * 0.6
    opt = NVMeOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), str(tmp_path))
    for xi in x:
        step(m, opt, xi)
    assert om.swapper._pool_ext.used == 0 or om.swapper._pool_ext.used < om.swapper.pool_bytes
    om.remove()
    opt.close()


def test_gradients_without_the_nvme_optimizer(tmp_path):
    """Grads offloaded, read back with om.grad(p): equal to in-memory ones."""
    torch.manual_seed(0)
    a = Tiny(layers=1)
    b = copy.deepcopy(a)
    om = offload_model(b, str(tmp_path))
    x = data(1)[0]
    for m in (a, b):
        logits = m(x[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, 64),
                                          x[:, 1:].reshape(-1)).backward()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(om.grad(q), p.grad), n
    om.remove()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
