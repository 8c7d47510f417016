"""python -m nvio.checkpoint info|verify (and `nvio checkpoint`).

info's answers are checked against the objects saved: every tensor's key
path, dtype, shape and storage bytes, and the bytes at the reported offset
of its record equal the tensor's storage. verify is shown a flipped byte in
every kind of zip structure (local header, data, data descriptor, central
directory, end records), truncated files, a corrupt pickle and wrong sizes,
and must name the record and offset each time.
"""
import io
import json
import struct
import subprocess
import sys
import zipfile

import pytest

import nvio
import nvio_testutil
from nvio import _cli
from nvio._base import torchzip as _zip
from nvio.checkpoint import _inspect
from nvio.checkpoint.__main__ import main as ck_main

torch = pytest.importorskip("torch")


def state():
    """Nested state with shared storages, views, odd dtypes, 0-dim and empty."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(20, 30, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8, generator=g)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(), "optim": opt.state_dict(),
        "views": {"base": base, "row": base[3], "t": base.t(), "slice": base[2:9:3, 1::4]},
        "odd": [torch.randint(0, 9, (n,), dtype=torch.int8, generator=g) for n in (1, 4097)],
        "bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "c64": torch.randn(4, dtype=torch.complex64, generator=g),
        "scalar": torch.tensor(2.5), "empty": torch.empty(0, 3),
        "step": 12, "name": "run",
    }


def tensors_of(obj, path=()):
    """(key path string, tensor) of every tensor, as info walks them."""
    if isinstance(obj, torch.Tensor):
        return [("/".join(str(k) for k in path), obj)]
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += tensors_of(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += tensors_of(v, path + (i,))
    return out


def save_with(kind, obj, p, handle=None):
    if kind == "nvio":
        nvio.save(obj, p, handle=handle)
    else:
        torch.save(obj, p)


def check_info(d, obj, p, kind):
    want = tensors_of(obj)
    got = {t["key"]: t for t in d["tensors"]}
    assert sorted(got) == sorted(k for k, _ in want)
    users = {}
    for k, t in want:
        users.setdefault(t.untyped_storage().data_ptr(), []).append(k)
    raw = p.read_bytes()
    recs = {r["name"]: r for r in d["records"]}
    for k, t in want:
        e = got[k]
        assert e["dtype"] == str(t.dtype).replace("torch.", ""), k
        assert e["shape"] == list(t.shape), k
        assert e["stride"] == list(t.stride()), k
        assert e["storage_offset"] == t.storage_offset(), k
        assert e["storage_bytes"] == t.untyped_storage().nbytes(), k
        assert e["record"] == "%s/data/%s" % (d["archive"], e["storage"]), k
        off = e["offset"]
        assert off == recs[e["record"]]["offset"], k
        assert raw[off:off + e["storage_bytes"]] == \
            nvio_testutil.storage_bytes(t.untyped_storage()).numpy().tobytes(), k
        assert e["align"] == off & -off, k
        if kind == "nvio" and e["storage_bytes"]:
            assert e["align"] >= 4096, k
        shared = len(users[t.untyped_storage().data_ptr()]) > 1
        assert e["shared"] == shared, k
    assert d["writer"] == kind if kind == "nvio" else d["writer"] == "torch"
    assert d["size"] == len(raw)
    with zipfile.ZipFile(p) as z:
        zi = {i.filename: i for i in z.infolist()}
    assert sorted(recs) == sorted(zi)
    for n, r in recs.items():
        assert r["size"] == zi[n].file_size and int(r["crc32"], 16) == zi[n].CRC, n
    assert d["pickle"] == "ok"


def test_info_nvio_file_every_engine(handle, tmp_path):
    obj = state()
    p = tmp_path / "ck.pt"
    save_with("nvio", obj, p, handle)
    check_info(_inspect.info(p), obj, p, "nvio")


@pytest.mark.parametrize("kind", ["nvio", "torch"])
def test_info_json_and_text(kind, tmp_path, capsys):
    obj = state()
    p = tmp_path / "state.v1.pt"
    save_with(kind, obj, p)
    assert ck_main(["info", str(p), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    check_info(d, obj, p, kind)
    # torch names the records' directory after the file up to its last dot, nvio up
    # to its first
    assert d["archive"] == "state.v1"      # torch's name for it, nvio's too
    assert ck_main(["info", str(p), "--records"]) == 0
    out = capsys.readouterr().out
    for k, t in tensors_of(obj):
        assert any(line.split()[0] == k for line in out.splitlines() if line.strip()), k
    assert d["archive"] + "/data.pkl" in out
    assert ("written by nvio" if kind == "nvio" else "written by torch.save") in out


def test_info_of_pickle_needing_full_unpickler(tmp_path):
    p = tmp_path / "obj.pt"
    torch.save({"w": torch.ones(3), "odd": zipfile.ZipInfo("x")}, p)
    d = _inspect.info(p)
    assert "weights_only=True" in d["pickle"]
    assert d["tensors"] == []
    assert len([r for r in d["records"] if "/data/" in r["name"]]) == 1
    rep = _inspect.verify(p)
    assert rep["ok"] and any("weights_only" in w for w in rep["warnings"])


def test_legacy_format_is_named(tmp_path, capsys):
    p = tmp_path / "old.pt"
    torch.save({"a": torch.ones(3)}, p, _use_new_zipfile_serialization=False)
    assert ck_main(["info", str(p)]) == 1
    err = capsys.readouterr().err
    assert "legacy format" in err and str(p) in err
    assert ck_main(["verify", str(p)]) == 1
    assert "NOT VERIFIED (legacy format)" in capsys.readouterr().out
    assert _inspect.verify(p)["status"] == "legacy"


def test_not_a_checkpoint(tmp_path, capsys):
    for name, data in [("empty", b""), ("text", b"hello world\n" * 10),
                       ("zip", None)]:
        p = tmp_path / name
        if data is None:
            with zipfile.ZipFile(p, "w") as z:
                z.writestr("a.txt", "x")
        else:
            p.write_bytes(data)
        assert ck_main(["info", str(p)]) == 1
        err = capsys.readouterr().err
        assert str(p) in err
        rep = _inspect.verify(p)
        assert not rep["ok"] and str(p) in rep["problems"][0]["message"]
    assert ck_main(["info", str(tmp_path / "missing.pt")]) == 1
    assert "No such file" in capsys.readouterr().err


# --- verify ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("v")
    obj = {"w": torch.randn(100, 7), "b": torch.arange(9), "s": torch.tensor(1.0)}
    out = {}
    for kind in ("nvio", "torch"):
        p = d / (kind + ".pt")
        save_with(kind, obj, p)
        out[kind] = p.read_bytes()
    return out


def layout(raw):
    """Structure offsets of a zip: per record (name, header offset, data
    offset, size, descriptor offset), the CD offset, the EOCD offset."""
    z = zipfile.ZipFile(io.BytesIO(raw))
    recs = []
    for i in z.infolist():
        nlen, xlen = struct.unpack_from("<HH", raw, i.header_offset + 26)
        data = i.header_offset + 30 + nlen + xlen
        recs.append((i.filename, i.header_offset, data, i.file_size, data + i.file_size))
    eocd = raw.rfind(b"PK\x05\x06")
    z64 = raw.rfind(b"PK\x06\x06")
    cd = struct.unpack_from("<Q", raw, z64 + 48)[0] if z64 >= 0 else \
        struct.unpack_from("<I", raw, eocd + 16)[0]
    return recs, cd, z64, eocd


def run_verify(tmp_path, raw, name="bad.pt"):
    p = tmp_path / name
    p.write_bytes(raw)
    return _inspect.verify(p), p


def flipped(raw, off, mask=0x5A):
    b = bytearray(raw)
    b[off] ^= mask
    return bytes(b)


@pytest.mark.parametrize("kind", ["nvio", "torch"])
def test_verify_intact(kind, files, tmp_path, capsys):
    rep, p = run_verify(tmp_path, files[kind])
    assert rep["ok"] and rep["status"] == "ok" and rep["problems"] == []
    recs, _, _, _ = layout(files[kind])
    assert rep["records_checked"] == len(recs)
    assert rep["bytes_checked"] == sum(r[3] for r in recs)
    assert ck_main(["verify", str(p)]) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize("reader", ["nvio", "pread"])
@pytest.mark.parametrize("kind", ["nvio", "torch"])
def test_verify_flipped_data_byte_in_every_record(kind, reader, files, tmp_path, monkeypatch):
    if reader == "pread":          # libnvio cannot open the file: plain pread
        from nvio.checkpoint import _save

        def refuse():
            raise OSError(95, "refused by the test")
        monkeypatch.setattr(_save, "default_handle", refuse)
    monkeypatch.setattr(_inspect, "CHUNK", 1000)      # records span chunks
    raw = files[kind]
    recs, _, _, _ = layout(raw)
    for name, _, data, size, _ in recs:
        for k in sorted({0, size // 2, size - 1}):
            rep, _ = run_verify(tmp_path, flipped(raw, data + k))
            assert not rep["ok"], (name, k)
            crc = [q for q in rep["problems"] if "CRC-32 mismatch" in q["message"]]
            assert len(crc) == 1 and crc[0]["record"] == name and crc[0]["offset"] == data, \
                rep["problems"]


@pytest.mark.parametrize("kind", ["nvio", "torch"])
def test_verify_flipped_local_header(kind, files, tmp_path):
    raw = files[kind]
    recs, _, _, _ = layout(raw)
    # signature, flags, method, CRC, compressed and plain size, name length,
    # extra length, first and last byte of the name
    fields = [0, 3, 6, 8, 14, 18, 22, 26, 28, 30]
    for name, hdr, _, _, _ in recs:
        nl = len(name.encode())
        for f in fields + [30 + nl - 1]:
            rep, _ = run_verify(tmp_path, flipped(raw, hdr + f))
            assert not rep["ok"], (name, f)
            assert any(q["record"] == name for q in rep["problems"]), (name, f, rep["problems"])


@pytest.mark.parametrize("kind", ["nvio", "torch"])
def test_verify_flipped_data_descriptor(kind, files, tmp_path):
    raw = files[kind]
    recs, _, _, _ = layout(raw)
    for name, _, _, _, desc in recs:
        for f in (4, 7, 8, 12):          # CRC, compressed size, size
            rep, _ = run_verify(tmp_path, flipped(raw, desc + f))
            assert not rep["ok"], (name, f)
            q = [q for q in rep["problems"] if q["record"] == name]
            assert q and q[0]["offset"] == desc and "data descriptor" in q[0]["message"], \
                rep["problems"]


@pytest.mark.parametrize("kind", ["nvio", "torch"])
def test_verify_flipped_central_directory(kind, files, tmp_path):
    raw = files[kind]
    recs, cd, _, _ = layout(raw)
    p = cd
    for name, _, _, _, _ in recs:
        nlen, xlen, clen = struct.unpack_from("<HHH", raw, p + 28)
        # signature, method, CRC, compressed size, size, local header offset, name
        for f in (0, 10, 16, 20, 24, 42, 46):
            rep, _ = run_verify(tmp_path, flipped(raw, p + f))
            assert not rep["ok"], (name, f)
            assert rep["problems"], (name, f)
        p += 46 + nlen + xlen + clen


@pytest.mark.parametrize("kind", ["nvio", "torch"])
def test_verify_bad_end_records(kind, files, tmp_path):
    raw = files[kind]
    _, cd, z64, eocd = layout(raw)
    offs = [eocd + 0, eocd + 4]
    if z64 >= 0:
        offs += [z64 + 0, z64 + 32, z64 + 48]           # signature, count, CD offset
    else:
        offs += [eocd + 10, eocd + 12, eocd + 16]       # count, CD size, CD offset
    for off in offs:
        rep, _ = run_verify(tmp_path, flipped(raw, off, 0x01 if off > eocd else 0x5A))
        assert not rep["ok"], off
    # a directory offset pointing into the data
    b = bytearray(raw)
    if z64 >= 0:
        struct.pack_into("<Q", b, z64 + 48, cd - 64)
    else:
        struct.pack_into("<I", b, eocd + 16, cd - 64)
    rep, _ = run_verify(tmp_path, bytes(b))
    assert not rep["ok"]
    assert "central directory" in rep["problems"][0]["message"]


@pytest.mark.parametrize("kind", ["nvio", "torch"])
def test_verify_truncated(kind, files, tmp_path, capsys):
    raw = files[kind]
    recs, cd, _, _ = layout(raw)
    cuts = [1, 4, 30, recs[-1][2] + 1, cd, len(raw) - 22, len(raw) - 1]
    for n in cuts:
        rep, p = run_verify(tmp_path, raw[:n])
        assert not rep["ok"], n
        assert str(p) in rep["problems"][0]["message"], n
    # cut the data of one record out, keep the rest: the offsets move
    name, hdr, data, size, desc = [r for r in recs if "/data/" in r[0]][0]
    rep, p = run_verify(tmp_path, raw[:data + size // 2] + raw[data + size:])
    assert not rep["ok"]
    assert ck_main(["verify", str(p)]) == 1
    out = capsys.readouterr().out
    assert "CORRUPT" in out and str(p) in out


def rezip(raw, change):
    """A new stored zip with records changed by change(name, data) -> data
    (None drops the record), written as torch writes it (descriptors)."""
    src = zipfile.ZipFile(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for i in src.infolist():
            d = change(i.filename, src.read(i.filename))
            if d is not None:
                z.writestr(i.filename, d)
    return out.getvalue()


def test_verify_sizes_disagree_with_pickle(files, tmp_path):
    raw = files["torch"]
    w = [n for n in zipfile.ZipFile(io.BytesIO(raw)).namelist() if n.endswith("/data/0")][0]
    assert _inspect.verify(run_verify(tmp_path, rezip(raw, lambda n, d: d))[1])["ok"]
    rep, _ = run_verify(tmp_path, rezip(raw, lambda n, d: d[:-4] if n == w else d))
    assert not rep["ok"]
    assert rep["problems"][0]["record"] == w and "the pickle's storage needs" in \
        rep["problems"][0]["message"]
    rep, _ = run_verify(tmp_path, rezip(raw, lambda n, d: None if n == w else d))
    assert not rep["ok"] and rep["problems"][0]["record"] == w
    assert "missing" in rep["problems"][0]["message"]


def test_verify_corrupt_pickle_with_good_crc(files, tmp_path):
    raw = files["torch"]
    rep, _ = run_verify(tmp_path, rezip(raw, lambda n, d: d[:-3] if n.endswith("data.pkl")
                                        else d))
    assert not rep["ok"]
    q = rep["problems"][0]
    assert q["record"].endswith("data.pkl") and "pickle is corrupt" in q["message"]


def test_verify_cli_names_record_and_offset(files, tmp_path, capsys):
    raw = files["nvio"]
    recs, _, _, _ = layout(raw)
    name, _, data, _, _ = [r for r in recs if "/data/" in r[0]][0]
    p = tmp_path / "bad.pt"
    p.write_bytes(flipped(raw, data + 3))
    r = subprocess.run([sys.executable, "-m", "nvio.checkpoint", "verify", str(p)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r
    assert "%s: record %s, offset %d: CRC-32 mismatch" % (p, name, data) in r.stdout
    assert ck_main(["verify", "--json", str(p)]) == 1
    d = json.loads(capsys.readouterr().out)
    assert not d["ok"] and d["problems"][0]["offset"] == data
    assert d["problems"][0]["record"] == name
    with pytest.raises(SystemExit) as ei:
        ck_main(["bogus"])
    assert ei.value.code == 2


def test_nvio_command_dispatches(files, tmp_path, capsys):
    p = tmp_path / "ok.pt"
    p.write_bytes(files["nvio"])
    assert _cli.main(["checkpoint", "verify", str(p)]) == 0
    assert "OK" in capsys.readouterr().out
    assert _cli.main(["checkpoint", "info", "--json", str(p)]) == 0
    assert json.loads(capsys.readouterr().out)["writer"] == "nvio"
    with pytest.raises(SystemExit) as ei:
        _cli.main(["checkpoint", "--help"])
    assert ei.value.code == 0
    assert "nvio checkpoint" in capsys.readouterr().out


def test_zip64_records(tmp_path, monkeypatch):
    """Records past the zip64 limit (lowered here) carry zip64 fields."""
    monkeypatch.setattr(_zip, "ZIP64_LIMIT", 1000)
    obj = {"w": torch.randn(2000), "b": torch.ones(3)}
    p = tmp_path / "z64.pt"
    nvio.save(obj, p)
    monkeypatch.undo()
    rep = _inspect.verify(p)
    assert rep["ok"], rep
    check_info(_inspect.info(p), obj, p, "nvio")
    raw = p.read_bytes()
    recs, _, _, _ = layout(raw)
    name, _, data, size, desc = [r for r in recs if r[3] >= 1000][0]
    rep, _ = run_verify(tmp_path, flipped(raw, desc + 10))       # zip64 descriptor size
    assert not rep["ok"] and rep["problems"][0]["record"] == name


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_info_tensor_kinds_without_one_storage(tmp_path):
    """Sparse and jagged tensors list their parts; quantized and nested ones
    (which cannot be rebuilt on the meta device) are rebuilt from the file;
    storages saved as such are listed too."""
    vals = torch.arange(5, dtype=torch.float32)
    cases = {
        "coo": (torch.eye(3).to_sparse(), ["coo/indices", "coo/values"]),
        "csr": (torch.eye(3).to_sparse_csr(), ["csr/crow_indices", "csr/col_indices",
                                               "csr/values"]),
        "q": (torch.quantize_per_tensor(torch.randn(6), 0.1, 0, torch.qint8), ["q"]),
        "typed": (torch.arange(3).storage(), ["typed"]),
        "untyped": (torch.arange(4, dtype=torch.int16).untyped_storage(), ["untyped"]),
        "nested": (torch.nested.nested_tensor([vals[:2], vals[2:]]), ["nested"]),
        "jagged": (torch.nested.nested_tensor([vals[:2], vals[2:]], layout=torch.jagged),
                   ["jagged/values", "jagged/offsets"]),
    }
    p = tmp_path / "kinds.pt"
    torch.save({k: v for k, (v, _) in cases.items()}, p)
    d = _inspect.info(p)
    assert d["pickle"] == "ok", d["pickle"]
    got = {t["key"]: t for t in d["tensors"]}
    assert sorted(got) == sorted(k for _, ks in cases.values() for k in ks)
    assert got["typed"]["dtype"] == "int64" and got["typed"]["shape"] == [3]
    assert got["q"]["dtype"] == "qint8" and got["q"]["shape"] == [6]
    assert got["jagged/values"]["shape"] == [5] and got["nested"]["shape"] is None
    raw = p.read_bytes()
    assert raw[got["untyped"]["offset"]:got["untyped"]["offset"] + 8] == \
        bytes(cases["untyped"][0])
    rep = _inspect.verify(p)
    assert rep["ok"] and rep["warnings"] == [], rep
