"""nvio.dcp.FileSystemWriter/FileSystemReader take every argument torch
2.13's take, with the same meaning.

Stream extensions (``_extensions``: torch's test Rot13Example, ZStandard)
and ``serialization_format`` go through DCP's own per-item transforms into
page-aligned buffers that nvio writes: the data files are DCP's byte for
byte (the safetensors layout up to the order of its JSON header's keys, which
the safetensors library does not fix), and read back through both readers.
"""
import inspect
import io
import json
import os
import struct
import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint._extension import ZStandard  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.filesystem import SerializationFormat  # noqa: E402
from torch.testing._internal.distributed.checkpoint_utils import (  # noqa: E402
    Rot13Example, get_test_extension_registry)

import nvio  # noqa: E402
import nvio.dcp as nd  # noqa: E402

EXTENSIONS = {"rot13": lambda: [Rot13Example()], "zstd": lambda: [ZStandard()]}


def ext(name):
    if name == "zstd" and not ZStandard.is_available():
        pytest.skip("ZStandard needs the zstandard or pyzstd package")
    return EXTENSIONS[name]()


def state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(300, 70, generator=g), "half": torch.randn(33, generator=g).half(),
            "view": torch.randn(40, 40, generator=g)[5:9, 3:20], "i": torch.arange(999),
            "step": 12, "s": "text", "n": {"l": [1, torch.ones(3)]}}


def empty(sd):
    out = {}
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            out[k] = torch.zeros(v.shape, dtype=v.dtype)
        elif isinstance(v, dict):
            out[k] = {"l": [0, torch.zeros(3)]}
        else:
            out[k] = type(v)()
    return out


def same(a, b):
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            assert v.dtype == b[k].dtype and torch.equal(v, b[k]), k
        elif isinstance(v, dict):
            assert v["l"][0] == b[k]["l"][0] and torch.equal(v["l"][1], b[k]["l"][1])
        else:
            assert v == b[k], k


def save(sd, writer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=writer, no_dist=True)


def load(sd, reader):
    out = empty(sd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=reader, no_dist=True)
    return out


def data_files(d):
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d)) if n.endswith(".distcp")}


# --- the signatures ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["FileSystemWriter", "FileSystemReader"])
def test_every_torch_argument_is_taken_in_its_place_with_its_default(name):
    theirs = inspect.signature(getattr(dcp, name)).parameters
    mine = inspect.signature(getattr(nd, name)).parameters
    t, m = list(theirs.values()), list(mine.values())
    assert [p.name for p in m[:len(t)]] == [p.name for p in t]
    for a, b in zip(t, m):
        assert (a.kind, a.default) == (b.kind, b.default), a.name
    for extra in m[len(t):]:        # nvio's additions are keyword-only
        assert extra.kind is inspect.Parameter.KEYWORD_ONLY, extra.name


def test_extensions_none_and_empty_mean_none(tmp_path):
    sd = state(1)
    for i, e in enumerate((None, [], ())):
        d = tmp_path / str(i)
        save(sd, nd.FileSystemWriter(d, _extensions=e))
        md = dcp.FileSystemReader(d).read_metadata()
        assert all(getattr(s, "transform_descriptors", None) is None
                   for s in md.storage_data.values())
        same(sd, load(sd, dcp.FileSystemReader(d)))


def test_bad_serialization_format_and_extension_are_refused():
    with pytest.raises(ValueError, match="serialization_format"):
        nd.FileSystemWriter("/nonexistent", serialization_format="pickle")
    with pytest.raises(TypeError, match="StreamTransformExtension"):
        nd.FileSystemWriter("/nonexistent", _extensions=[object()])
    w = nd.FileSystemWriter("/nonexistent", serialization_format="safetensors")
    assert w.serialization_format is SerializationFormat.SAFETENSORS


# --- extensions: DCP's bytes, written by nvio ------------------------------------------


@pytest.mark.parametrize("kw", [{}, {"thread_count": 3}, {"single_file_per_rank": False}],
                         ids=["one-file", "threads", "file-per-item"])
@pytest.mark.parametrize("which", ["rot13", "zstd"])
def test_extension_files_are_dcps_byte_for_byte_and_read_back(tmp_path, handle, which, kw):
    sd = state(2)
    save(sd, dcp.FileSystemWriter(tmp_path / "torch", _extensions=ext(which), **kw))
    save(sd, nd.FileSystemWriter(tmp_path / "nvio", _extensions=ext(which), handle=handle, **kw))
    a, b = data_files(tmp_path / "torch"), data_files(tmp_path / "nvio")
    assert a.keys() == b.keys() and len(a) >= 1
    for n in a:
        assert a[n] == b[n], n
    ma = dcp.FileSystemReader(tmp_path / "torch").read_metadata()
    mb = nd.FileSystemReader(tmp_path / "nvio").read_metadata()
    assert ma.storage_data == mb.storage_data
    assert all(s.transform_descriptors for s in mb.storage_data.values())
    reg = get_test_extension_registry()
    for reader in (dcp.FileSystemReader(tmp_path / "nvio", _extension_registry=reg),
                   nd.FileSystemReader(tmp_path / "nvio", reg, handle=handle),
                   nd.FileSystemReader(tmp_path / "torch", reg, handle=handle)):
        same(sd, load(sd, reader))


def test_streamed_files_larger_than_the_buffers(tmp_path, handle, monkeypatch):
    """Many buffer turns, an unaligned tail: still DCP's bytes."""
    monkeypatch.setattr(nd, "_SINK_CHUNK", 64 << 10)
    g = torch.Generator().manual_seed(3)
    sd = {"big": torch.randn(300_001, generator=g), "small": torch.arange(7), "b": "x" * 70_000}
    save(sd, dcp.FileSystemWriter(tmp_path / "torch", _extensions=[Rot13Example()]))
    save(sd, nd.FileSystemWriter(tmp_path / "nvio", _extensions=[Rot13Example()], handle=handle))
    a, b = data_files(tmp_path / "torch"), data_files(tmp_path / "nvio")
    assert a == b and len(a["__0_0.distcp"]) % 4096 != 0
    out = {"big": torch.zeros(300_001), "small": torch.zeros(7, dtype=torch.int64), "b": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=nd.FileSystemReader(tmp_path / "nvio",
                                                         get_test_extension_registry(),
                                                         handle=handle), no_dist=True)
    assert torch.equal(out["big"], sd["big"]) and out["b"] == sd["b"]


def test_a_transform_that_fails_leaves_the_old_checkpoint(tmp_path):
    class Broken(Rot13Example):
        def transform_to(self, output):
            inner = super().transform_to(output)
            calls = []

            class W(io.RawIOBase):
                def writable(self):
                    return True

                def write(self, b):
                    calls.append(len(b))
                    if len(calls) > 3:
                        raise OSError(28, "injected: no space left in the transform")
                    return inner.write(b)

                def flush(self):
                    inner.flush()
            return W()
    d = tmp_path / "ck"
    old = state(4)
    save(old, nd.FileSystemWriter(d, _extensions=[Rot13Example()]))
    before = sorted(os.listdir(d))
    with pytest.raises((OSError, CheckpointException)):
        save(state(5), nd.FileSystemWriter(d, _extensions=[Broken()]))
    assert sorted(os.listdir(d)) == before
    same(old, load(old, nd.FileSystemReader(d, get_test_extension_registry())))


def test_async_save_with_extensions(tmp_path):
    sd = state(6)
    w = nd.FileSystemWriter(tmp_path, _extensions=[Rot13Example()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.async_save(sd, storage_writer=w, no_dist=True).result()
    same(sd, load(sd, dcp.FileSystemReader(tmp_path, get_test_extension_registry())))


# --- serialization_format=SAFETENSORS --------------------------------------------------


def _safetensors_parts(blob, at):
    n = struct.unpack("<Q", blob[at:at + 8])[0]
    return json.loads(blob[at + 8:at + 8 + n]), blob[at + 8 + n:]


def test_safetensors_layout_is_dcps(tmp_path, handle):
    pytest.importorskip("safetensors")
    sd = {"w": torch.randn(50, 3), "i": torch.arange(5), "step": 3}
    fmt = SerializationFormat.SAFETENSORS
    save(sd, dcp.FileSystemWriter(tmp_path / "torch", serialization_format=fmt))
    save(sd, nd.FileSystemWriter(tmp_path / "nvio", serialization_format=fmt, handle=handle))
    a, b = data_files(tmp_path / "torch"), data_files(tmp_path / "nvio")
    assert a.keys() == b.keys()
    ma = dcp.FileSystemReader(tmp_path / "torch").read_metadata()
    mb = nd.FileSystemReader(tmp_path / "nvio").read_metadata()
    assert ma.storage_data == mb.storage_data
    at = next(s.offset for k, s in mb.storage_data.items() if k.fqn == "w")
    for n in a:
        assert a[n][:at] == b[n][:at]       # the bytes items
        (ha, ta), (hb, tb) = _safetensors_parts(a[n], at), _safetensors_parts(b[n], at)
        assert ha == hb and ta == tb
