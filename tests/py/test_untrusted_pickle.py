"""nvio.load(weights_only=True) is exactly as strict as
torch.load(weights_only=True) (issue 35, item 1), on pickles built here
opcode by opcode: what torch's weights-only unpickler refuses nvio refuses
too, whichever unpickler nvio takes; memory stays bounded by what the
pickle references (a memo index, a record nothing names); corrupt zips give
CheckpointError, the CLI no traceback; a FIFO never blocks."""
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import zlib

import pytest

import nvio
from nvio.checkpoint import _load

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(nvio.__file__)))     # children import it


# --- pickles, opcode by opcode -----------------------------------------------

PROTO2 = b"\x80\x02"
MARK, STOP, TUPLE, TUPLE1, TUPLE2 = b"(", b".", b"t", b"\x85", b"\x86"
EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE = b"}", b"]", b")"
REDUCE, BUILD, SETITEM, SETITEMS, APPEND, APPENDS = b"R", b"b", b"s", b"u", b"a", b"e"
NONE, TRUE, FALSE, BINPERSID = b"N", b"\x88", b"\x89", b"Q"


def glob(mod, name):
    return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"


def uni(s):
    b = s.encode("utf-8")
    return b"X" + struct.pack("<I", len(b)) + b


def num(n):
    return b"K" + bytes([n]) if 0 <= n < 256 else b"J" + struct.pack("<i", n)


def put(i):
    return b"q" + bytes([i]) if i < 256 else b"r" + struct.pack("<I", i)


def storage(key, numel, stype="FloatStorage"):
    """A persistent id as torch.save writes it, loaded (BINPERSID)."""
    return (MARK + uni("storage") + glob("torch", stype) + uni(key) + uni("cpu") +
            num(numel) + TUPLE + BINPERSID)


def tensor(key, numel):
    """_rebuild_tensor_v2(storage, 0, (numel,), (1,), False, OrderedDict())."""
    return (glob("torch._utils", "_rebuild_tensor_v2") + MARK + storage(key, numel) +
            num(0) + num(numel) + TUPLE1 + num(1) + TUPLE1 + FALSE +
            glob("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE + TUPLE + REDUCE)


def write_zip(path, records, hack=None):
    """A stored zip archive of records {name: bytes, or an int: that many
    bytes of hole (no data written: a sparse file)}. hack: {name: {"lextra":
    local extra field, "cextra": central extra field, "csize": the central
    directory's size fields}} to make a record corrupt."""
    hack = hack or {}
    with open(path, "wb") as f:
        central = []
        for name, data in records.items():
            nb = name.encode()
            off = f.tell()
            size = data if isinstance(data, int) else len(data)
            crc = 0 if isinstance(data, int) else zlib.crc32(data)
            h = hack.get(name, {})
            lx, cx, cs = h.get("lextra", b""), h.get("cextra", b""), h.get("csize", size)
            f.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, crc, size, size,
                                len(nb), len(lx)) + nb + lx)
            if isinstance(data, int):
                f.seek(size, os.SEEK_CUR)
            else:
                f.write(data)
            central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0,
                                       crc, cs, cs, len(nb), len(cx), 0, 0, 0, 0, off) + nb + cx)
        cd_off = f.tell()
        cd = b"".join(central)
        f.write(cd)
        f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central),
                            len(cd), cd_off, 0))


def checkpoint(path, pkl, data=None):
    """A torch zip checkpoint whose data.pkl is pkl; data: {key: bytes or a
    size (a hole)} for the records data/<key>."""
    recs = {"ck/data.pkl": pkl, "ck/byteorder": b"little"}
    for k, v in (data or {}).items():
        recs["ck/data/" + k] = v
    recs["ck/version"] = b"3\n"
    write_zip(path, recs)
    return path


FOUR = struct.pack("<4f", 1, 2, 3, 4)


def outcome(fn):
    try:
        return "ok", fn()
    except Exception as e:     # noqa: BLE001 - the verdict is what is compared
        return "refused", e


def verdicts(p):
    return (outcome(lambda: torch.load(p, weights_only=True)),
            outcome(lambda: nvio.load(p)))


def spy_torch_unpickler(monkeypatch):
    from torch import _weights_only_unpickler as wo
    calls = []
    orig = wo.Unpickler.load

    def spy(self):
        calls.append(1)
        return orig(self)
    monkeypatch.setattr(wo.Unpickler, "load", spy)
    return calls


def test_torch_saves_form_takes_the_fast_path(tmp_path, monkeypatch):
    """The crafted pickles follow torch.save's form: a state dict of them
    loads through the fast path (torch's unpickler never called), and the
    scan names exactly the storages it references."""
    pkl = PROTO2 + EMPTY_DICT + MARK + uni("a") + tensor("0", 4) + uni("b") + \
        tensor("0", 4) + SETITEMS + STOP
    p = checkpoint(tmp_path / "ok.pt", pkl, {"0": FOUR, "1": FOUR})
    assert _load._scan(pkl) == (True, ["0", "0"])
    calls = spy_torch_unpickler(monkeypatch)
    got = nvio.load(p)
    assert calls == []
    assert got.keys() == {"a", "b"} and torch.equal(got["a"], torch.tensor([1., 2, 3, 4]))
    assert got["a"].untyped_storage().data_ptr() == got["b"].untyped_storage().data_ptr()
    monkeypatch.undo()
    assert torch.equal(torch.load(p, weights_only=True)["b"], got["b"])


# Pickles torch's weights-only unpickler refuses and the C unpickler (with
# nvio's restricted find_class) accepted: name -> pickle after PROTO 2.
T = tensor("0", 4)
REFUSED = {
    "setitem_on_tensor": T + num(0) + num(9) + SETITEM + STOP,
    "setitems_on_storage": storage("0", 4) + MARK + num(0) + num(9) + SETITEMS + STOP,
    "build_tensor_3_tuple": T + MARK + TRUE + NONE + EMPTY_DICT + TUPLE + BUILD + STOP,
    "build_tensor_5_tuple": T + MARK + tensor("0", 4) + NONE + EMPTY_DICT + TRUE +
    EMPTY_DICT + TUPLE + BUILD + STOP,
    "obj": MARK + glob("collections", "OrderedDict") + b"o" + STOP,
    "appends_on_bytearray": b"\x96" + struct.pack("<Q", 2) + b"ab" + MARK + num(65) +
    APPENDS + STOP,
    "additems_on_tensor": T + MARK + num(1) + b"\x90" + STOP,
    "frame_and_memoize": b"\x95" + struct.pack("<Q", 3) + EMPTY_DICT + b"\x94" + STOP,
    "dup": EMPTY_DICT + b"2" + TUPLE2 + STOP,
    "memoize": EMPTY_DICT + b"\x94" + STOP,
    "short_binunicode": b"\x8c\x01a" + STOP,
    "pop": EMPTY_DICT + EMPTY_LIST + b"0" + STOP,
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_torch_refuses_nvio_refuses(name, tmp_path):
    p = checkpoint(tmp_path / "x.pt", PROTO2 + REFUSED[name], {"0": FOUR})
    (tv, te), (nv, ne) = verdicts(p)
    assert tv == "refused", "torch accepted %s: %r" % (name, te)
    assert nv == "refused", "nvio.load accepted %s (torch refused: %s): %r" % (name, te, ne)
    assert isinstance(ne, (pickle.UnpicklingError, nvio.CheckpointError)), repr(ne)
    assert str(p) in str(ne)


def test_a_global_as_a_value_is_torchs_object(tmp_path):
    """A global the fast path knows, used as a plain value: nvio gives what
    torch gives (the class itself), never the fast path's wrapper."""
    pkl = PROTO2 + EMPTY_DICT + uni("cls") + glob("collections", "OrderedDict") + SETITEM + \
        uni("st") + glob("torch", "FloatStorage") + SETITEM + STOP
    p = checkpoint(tmp_path / "g.pt", pkl)
    (tv, want), (nv, got) = verdicts(p)
    assert tv == nv == "ok", (want, got)
    assert got["cls"] is want["cls"] and got["st"] == want["st"]


# Pickles cut short in an opcode's argument (torch's unpickler unpacks it
# with struct: struct.error), after an opcode the scan refuses.
TRUNCATED = {
    "binint": b"J\x00\x00",
    "binfloat_after_sparse_memo": EMPTY_DICT + put(5) + b"G\x00",
    "binunicode_length": EMPTY_DICT + put(5) + b"X\x00",
    "long_binget": b"j\x00",
}


@pytest.mark.parametrize("name", sorted(TRUNCATED))
def test_truncated_opcode_argument_is_a_checkpoint_error(name, tmp_path):
    p = checkpoint(tmp_path / "t.pt", PROTO2 + TRUNCATED[name], {"0": FOUR})
    (tv, _), (nv, ne) = verdicts(p)
    assert tv == nv == "refused"
    assert isinstance(ne, (pickle.UnpicklingError, nvio.CheckpointError)), repr(ne)
    assert str(p) in str(ne)


def peak_rss_growth(code, timeout=120):
    """Run code in a fresh interpreter (nvio and torch imported, warmed up);
    the growth of its peak RSS (VmHWM) in bytes across code, and its stdout."""
    script = textwrap.dedent("""
        import sys, torch, nvio
        def hwm():
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        before = hwm()
    """) + textwrap.dedent(code) + "\nprint('GROWTH', hwm() - before)\n"
    env = dict(os.environ, PYTHONPATH=PYDIR)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=timeout, env=env, cwd=HERE)
    assert r.returncode == 0, r.stderr[-2000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("GROWTH")][-1]
    return int(line.split()[1]), r.stdout


def test_memo_index_does_not_size_memory(tmp_path):
    """LONG_BINPUT 2**25 on a real checkpoint's pickle: the C unpickler
    would allocate a 2**26-slot memo (~0.5 GiB, zeroed); torch's
    unpickler keeps a dict. nvio.load gives torch's result with no such
    growth."""
    good = tmp_path / "good.pt"
    p = tmp_path / "memo.pt"
    # a warm-up load in the child first, so that what is measured is the bomb
    nvio.save({"w": torch.ones(4)}, good)
    pkl = PROTO2 + EMPTY_DICT + put(1 << 25) + uni("w") + tensor("0", 4) + SETITEM + STOP
    checkpoint(p, pkl, {"0": FOUR})
    growth, out = peak_rss_growth("""
        nvio.load(%r)
        got = nvio.load(%r)
        want = torch.load(%r, weights_only=True)
        assert torch.equal(got["w"], want["w"]), (got, want)
        print("LOADED", got["w"].tolist())
    """ % (str(good), str(p), str(p)))
    assert "LOADED [1.0, 2.0, 3.0, 4.0]" in out
    assert growth < 64 << 20, "peak RSS grew by %d MiB" % (growth >> 20)


def test_scan_costs_no_more_memory_than_torchs_unpickler(tmp_path):
    """8 Mi NONEs then STOP (torch's unpickler: one 8-byte pointer each):
    the pre-scan held a 24-byte item per stack slot, 2.6 times torch's
    peak (214 MiB against 83); now one 8-byte item, as torch."""
    p = checkpoint(tmp_path / "nones.pt", PROTO2 + NONE * (8 << 20) + STOP)
    code = """
        got = %s
        assert got is None, got
    """
    mine, _ = peak_rss_growth(code % ("nvio.load(%r)" % str(p)))
    theirs, _ = peak_rss_growth(code % ("torch.load(%r, weights_only=True)" % str(p)))
    assert mine <= theirs * 1.25 + (16 << 20), (mine >> 20, theirs >> 20)


def test_ext_opcodes_never_reach_copyregs_cache(tmp_path):
    """With an extension code registered and used in the process
    (copyreg.add_extension), an EXT1 in a checkpoint would be served from
    copyreg's cache, past the restricted global lookup, and run os.system.
    Refused, and nothing runs."""
    flag = tmp_path / "pwned"
    files = []
    for i, ext in enumerate((b"\x82\xf0", b"\x83\xf0\x00", b"\x84\xf0\x00\x00\x00")):
        pkl = PROTO2 + ext + uni("touch %s" % flag) + TUPLE1 + REDUCE + STOP
        files.append(str(checkpoint(tmp_path / ("ext%d.pt" % i), pkl)))
    code = textwrap.dedent("""
        import copyreg, os, pickle, sys, torch, nvio
        copyreg.add_extension(os.system.__module__, "system", 240)
        assert pickle.loads(b"\\x80\\x02\\x82\\xf0.") is os.system     # the cache is filled
        for p in sys.argv[1:]:
            for name, fn in (("torch", lambda p: torch.load(p, weights_only=True)),
                             ("nvio", nvio.load)):
                try:
                    print(p, name, "ACCEPTED", fn(p))
                except Exception as e:
                    print(p, name, "REFUSED", type(e).__name__, str(e).splitlines()[0])
    """)
    r = subprocess.run([sys.executable, "-c", code, *files], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=PYDIR))
    assert r.returncode == 0, r.stderr[-2000:]
    for p in files:
        assert "%s torch REFUSED" % p in r.stdout, r.stdout
        assert "%s nvio REFUSED" % p in r.stdout, r.stdout
        assert "nvio.load: %s" % p in r.stdout, r.stdout
    assert not flag.exists(), "the pickle ran os.system: %s" % r.stdout


@pytest.mark.parametrize("layout", ["nothing_referenced", "small_referenced"])
def test_unreferenced_records_are_not_read(tmp_path, layout):
    """A 512 MiB record (a hole: 0 bytes on disk) that the pickle does not
    reference costs no memory; torch.load reads nothing of it either."""
    p = tmp_path / "sparse.pt"
    if layout == "nothing_referenced":
        checkpoint(p, PROTO2 + EMPTY_DICT + STOP, {"0": 512 << 20})
    else:
        pkl = PROTO2 + EMPTY_DICT + uni("w") + tensor("0", 4) + SETITEM + STOP
        checkpoint(p, pkl, {"0": FOUR, "1": 512 << 20})
    assert os.stat(p).st_blocks * 512 < 1 << 20           # really sparse
    growth, out = peak_rss_growth("""
        got = nvio.load(%r)
        print("KEYS", sorted(got))
    """ % str(p))
    assert "KEYS" in out
    assert growth < 64 << 20, "peak RSS grew by %d MiB" % (growth >> 20)


def test_storages_past_where_the_scan_lost_track(tmp_path):
    """A sparse memo index (torch accepts it) stops the scan: the storages
    named before it are read by the one big read, the later ones one by one
    as torch's unpickler asks; both hold the file's bytes."""
    g = torch.Generator().manual_seed(3)
    n = 300000
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    pkl = PROTO2 + EMPTY_DICT + uni("a") + tensor("0", n) + SETITEM + put(1 << 20) + \
        uni("b") + tensor("1", n) + SETITEM + STOP
    p = checkpoint(tmp_path / "m.pt", pkl, {"0": a.numpy().tobytes(), "1": b.numpy().tobytes()})
    assert _load._scan(pkl) == (False, ["0"])
    got = nvio.load(p)
    assert torch.equal(got["a"], a) and torch.equal(got["b"], b)
    assert torch.equal(torch.load(p, weights_only=True)["b"], b)


# --- corrupt zips -------------------------------------------------------------


def nvio_file(tmp_path):
    p = tmp_path / "good.pt"
    g = torch.Generator().manual_seed(1)
    nvio.save({"a": torch.randn(50, generator=g), "b": [torch.ones(3), {"c": 1.5}],
               "big": torch.randn(300000, generator=g)}, p)
    return p


def structure_offsets(good):
    """Offsets of the zip's own bytes: local headers, directory, end records."""
    n = len(good)
    offs = set(range(0, 64)) | set(range(max(0, n - 700), n))
    i = good.find(b"PK\x03\x04")
    while i >= 0:
        offs |= set(range(i, min(n, i + 40)))
        i = good.find(b"PK\x03\x04", i + 1)
    return sorted(offs)


def only_clear_errors(p, runs):
    bad = []
    for tag, fn in runs:
        try:
            fn()
        except nvio.CheckpointError as e:
            if str(p) not in str(e):
                bad.append((tag, "no path", str(e)[:100]))
        except pickle.UnpicklingError as e:     # the weights_only refusal names the file
            if str(p) not in str(e):
                bad.append((tag, "no path", str(e)[:100]))
        except Exception as e:     # noqa: BLE001 - what the test is about
            bad.append((tag, type(e).__name__, str(e)[:100]))
    return bad


def test_corrupt_zips_give_checkpoint_errors(tmp_path):
    """Every byte of the zip structure set to 0x00 / 0xFF (and every other
    one flipped), and the
    file cut at many lengths: nvio.load raises CheckpointError (or refuses
    the pickle), naming the file; never IndexError, struct.error, a raw
    ValueError."""
    good_p = nvio_file(tmp_path)
    good = good_p.read_bytes()
    q = tmp_path / "bad.pt"
    bare = []
    for i in structure_offsets(good):
        for v in (0x00, 0xFF) if i % 2 else (0x00, 0xFF, good[i] ^ 0x01):
            data = bytearray(good)
            data[i] = v
            q.write_bytes(data)
            bare += only_clear_errors(q, [((i, v), lambda: nvio.load(q))])
    for cut in list(range(0, len(good), max(1, len(good) // 150))) + \
            list(range(len(good) - 400, len(good), 5)):
        q.write_bytes(good[:cut])
        bare += only_clear_errors(q, [(("cut", cut), lambda: nvio.load(q))])
    assert not bare, bare[:10]


def test_overlapping_local_headers_and_bad_byteorder(tmp_path):
    """Two cases the mutations above found escaping: a directory entry whose
    local header overlaps the one before it (the vectored read refused it
    with a raw ValueError) and a byteorder record that is no byte order
    (torch.load's UnicodeDecodeError)."""
    p = checkpoint(tmp_path / "o.pt", PROTO2 + EMPTY_DICT + STOP, {"0": FOUR})
    data = bytearray(p.read_bytes())
    # the central entry of data/0 (third record) pointed 17 bytes into the second's header
    cd = data.index(b"PK\x01\x02")
    entries = []
    i = cd
    while data[i:i + 4] == b"PK\x01\x02":
        nlen = struct.unpack_from("<H", data, i + 28)[0]
        entries.append(i)
        i += 46 + nlen
    second = struct.unpack_from("<I", data, entries[1] + 42)[0]
    struct.pack_into("<I", data, entries[2] + 42, second + 17)
    q = tmp_path / "overlap.pt"
    q.write_bytes(data)
    with pytest.raises(nvio.CheckpointError) as ei:
        nvio.load(q)
    assert str(q) in str(ei.value) and "overlap" in str(ei.value)
    b = checkpoint(tmp_path / "b.pt", PROTO2 + EMPTY_DICT + STOP, {"0": FOUR})
    raw = bytearray(b.read_bytes())
    j = raw.index(b"little")
    raw[j:j + 6] = b"\xa3X\xc4?\xd8I"
    b.write_bytes(raw)
    with pytest.raises(nvio.CheckpointError) as ei:
        nvio.load(b)
    assert str(b) in str(ei.value) and "byteorder" in str(ei.value)


def test_bad_zip64_fields(tmp_path):
    """A directory entry announcing zip64 sizes whose zip64 extra field is
    short or cut (struct.error and IndexError escaped), and a local header's
    zip64 field cut short (verify's struct.error)."""
    import contextlib
    import io
    from nvio.checkpoint.__main__ import main
    base = {"ck/data.pkl": PROTO2 + EMPTY_DICT + STOP, "ck/byteorder": b"little",
            "ck/data/0": FOUR, "ck/version": b"3\n"}
    hacks = [{"cextra": b"\x01\x00\x10\x00" + b"\x00" * 4, "csize": 0xFFFFFFFF},
             {"cextra": b"\x01\x00\x00\x00", "csize": 0xFFFFFFFF},
             {"lextra": b"\x01\x00\x10\x00" + b"\x00" * 4}]
    for i, h in enumerate(hacks):
        p = tmp_path / ("z%d.pt" % i)
        write_zip(p, base, {"ck/data/0": h})
        if "cextra" in h:
            with pytest.raises(nvio.CheckpointError) as ei:
                nvio.load(p)
            assert str(p) in str(ei.value) and "zip64" in str(ei.value)
        for cmd in ("info", "verify"):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                rc = main([cmd, str(p)])
            assert rc in (0, 1) and "internal error" not in out.getvalue(), out.getvalue()


def run_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "nvio.checkpoint", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=PYDIR))


def test_cli_on_corrupt_files_prints_no_traceback(tmp_path):
    """info and verify on mutated and cut files (in this process: main()
    must return 1 or 0, never raise), then a few through the real command:
    no traceback."""
    import contextlib
    import io
    from nvio.checkpoint.__main__ import main
    good = nvio_file(tmp_path).read_bytes()
    q = tmp_path / "bad.pt"
    raised = []
    cases = [("mut", i, v) for i in structure_offsets(good)[::5] for v in (0x00, 0xFF)] + \
        [("cut", c, None) for c in range(0, len(good), max(1, len(good) // 40))]
    for kind, i, v in cases:
        data = bytearray(good[:i] if kind == "cut" else good)
        if kind == "mut":
            data[i] = v
        q.write_bytes(data)
        for cmd in ("info", "verify"):
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    rc = main([cmd, str(q)])
                assert rc in (0, 1)
            except Exception as e:     # noqa: BLE001 - what the test is about
                raised.append((cmd, kind, i, v, type(e).__name__, str(e)[:100]))
            if "internal error" in out.getvalue():      # main's last resort
                raised.append((cmd, kind, i, v, out.getvalue()[-200:]))
    assert not raised, raised[:10]
    # a pickle nested 200,000 deep (torch's unpickler builds it; walking it
    # recursively overflowed), an nvio format record of a digit int() refuses
    deep = checkpoint(tmp_path / "deep.pt", PROTO2 + NONE + TUPLE1 * 200000 + STOP)
    sup = tmp_path / "sup.pt"
    write_zip(sup, {"ck/data.pkl": PROTO2 + EMPTY_DICT + STOP, "ck/byteorder": b"little",
                    "ck/.data/nvio_format": "\u00b2".encode(), "ck/version": b"3\n"})
    for p, want in ((deep, (0, 0)), (sup, (0, 1))):
        for cmd, rc in zip(("info", "verify"), want):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                got = main([cmd, str(p)])
            assert got == rc and "internal error" not in out.getvalue(), (cmd, p, out.getvalue())
    q.write_bytes(good[:len(good) // 2])
    r = run_cli("verify", q)
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert str(q) in r.stderr + r.stdout


def test_fifo_never_blocks(tmp_path):
    """A FIFO (nobody writing) at the path: nvio.load, info, verify and the
    command each give a clear error naming the path and its type, at once
    (run in a child with a timeout: a blocked open fails the test instead
    of hanging it)."""
    f = tmp_path / "ck.pt"
    os.mkfifo(f)
    code = textwrap.dedent("""
        import sys, nvio
        from nvio.checkpoint import _inspect
        p = sys.argv[1]
        try:
            nvio.load(p)
            print("load: loaded")
        except nvio.CheckpointError as e:
            print("load:", e)
        try:
            _inspect.info(p)
            print("info: read")
        except _inspect.NotACheckpoint as e:
            print("info:", e)
        rep = _inspect.verify(p)
        print("verify:", rep["ok"], rep["problems"][0]["message"])
        import contextlib, io
        from nvio.checkpoint.__main__ import main
        for cmd in ("info", "verify"):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                rc = main([cmd, p])
            print("%s %d:" % (cmd, rc), out.getvalue().replace("\\n", " "))
    """)
    r = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=PYDIR))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 5, r.stdout
    for line in lines:
        assert str(f) in line and "FIFO" in line, line
    assert lines[2].startswith("verify: False")
    assert lines[3].startswith("info 1:") and lines[4].startswith("verify 1:"), lines
    # a directory is no checkpoint either
    with pytest.raises(nvio.CheckpointError) as ei:
        nvio.load(tmp_path)
    assert "directory" in str(ei.value) and str(tmp_path) in str(ei.value)


# --- the property: nvio refuses whenever torch refuses ---------------------------

try:
    import hypothesis
    from hypothesis import strategies as st
except ImportError:         # only the property test needs it (skipped below)
    hypothesis = None

PARAM = (glob("torch._utils", "_rebuild_parameter") + MARK + T + FALSE +
         glob("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE + TUPLE + REDUCE)
LEAF = {
    "none": NONE, "true": TRUE, "false": FALSE, "int1": num(7), "int4": num(-70000),
    "int2": b"M" + struct.pack("<H", 4000), "float": b"G" + struct.pack(">d", 2.5),
    "str": uni("k\u00e9y"), "sstr": b"U\x03abc", "long1": b"\x8a\x02\x01\x80",
    "etuple": EMPTY_TUPLE, "elist": EMPTY_LIST, "edict": EMPTY_DICT, "eset": b"\x8f",
    "tensor": T, "param": PARAM,
    "odict": glob("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE,
    "cls": glob("collections", "OrderedDict"), "dtype": glob("torch", "float32"),
    "size": glob("torch", "Size") + MARK + num(2) + num(3) + TUPLE + TUPLE1 + REDUCE,
}
# One element each torch's weights-only unpickler refuses; each pushes one value.
FORBIDDEN = {
    "setitem_tensor": T + num(0) + num(9) + SETITEM,
    "setitems_storage": storage("0", 4) + MARK + num(0) + num(9) + SETITEMS,
    "append_dict": EMPTY_DICT + num(1) + APPEND,
    "appends_tensor": T + MARK + num(1) + APPENDS,
    "setitem_list": EMPTY_LIST + num(0) + num(1) + SETITEM,
    "build_tensor": T + MARK + TRUE + NONE + EMPTY_DICT + TUPLE + BUILD,
    "build_list": EMPTY_LIST + EMPTY_DICT + BUILD,
    "obj": MARK + glob("collections", "OrderedDict") + b"o",
    "inst": MARK + b"icollections\nOrderedDict\n",
    "dup_pop": EMPTY_DICT + b"2" + b"0",
    "pop_mark": EMPTY_DICT + MARK + NONE + b"1",
    "memoize": EMPTY_DICT + b"\x94",
    "frame": b"\x95" + struct.pack("<Q", 1) + NONE,
    "short_binunicode": b"\x8c\x01a",
    "binunicode8": b"\x8d" + struct.pack("<Q", 1) + b"a",
    "short_binbytes": b"C\x01a",
    "bytearray8": b"\x96" + struct.pack("<Q", 1) + b"a",
    "additems_set": b"\x8f" + MARK + num(1) + b"\x90",
    "additems_tensor": T + MARK + num(1) + b"\x90",
    "frozenset": MARK + num(1) + b"\x91",
    "ext1": b"\x82\x01", "ext2": b"\x83\x01\x00", "ext4": b"\x84\x01\x00\x00\x00",
    "int_text": b"I5\n", "long_text": b"L5\n", "float_text": b"F1.5\n",
    "string_text": b"S'a'\n", "unicode_text": b"Vabc\n", "put_text": NONE + b"p0\n",
    "os_system": glob("os", "system") + uni("true") + TUPLE1 + REDUCE,
    "builtins_eval": glob("builtins", "eval") + uni("1") + TUPLE1 + REDUCE,
    "torch_load": glob("torch", "load"),
    "getattr": glob("builtins", "getattr") + T + uni("add_") + TUPLE2 + REDUCE,
    "newobj_dict": glob("builtins", "dict") + EMPTY_TUPLE + b"\x81",
    "newobj_ex": glob("collections", "OrderedDict") + EMPTY_TUPLE + EMPTY_DICT + b"\x92",
    "stack_global": uni("os") + uni("system") + b"\x93",
    "persid_module": MARK + uni("module") + uni("x") + TUPLE2 + BINPERSID,
    "persid_text": b"P0\n",
    "reduce_storage_type": glob("torch", "FloatStorage") + num(4) + TUPLE1 + REDUCE,
    "reduce_tensor": T + EMPTY_TUPLE + REDUCE,
    "next_buffer": b"\x97",
}


def serialize(tree, bad, at, rng):
    """The pickle of tree, the node numbered ``at`` (depth first) replaced
    by the bytes ``bad``; memo PUTs and GETs as rng decides."""
    out, memo, count = [PROTO2], [0], [0]

    def value(node):
        n = count[0]
        count[0] += 1
        if n == at:
            out.append(bad)
        elif node[0] == "ref":
            out.append(b"h" + bytes([rng.randrange(memo[0])]) if memo[0] else NONE)
        elif node[0] in LEAF:
            out.append(LEAF[node[0]])
        elif node[0] == "list":
            out.append(EMPTY_LIST)
            if len(node[1]) == 1 and rng.random() < 0.5:
                value(node[1][0])
                out.append(APPEND)
            elif node[1]:
                out.append(MARK)
                for k in node[1]:
                    value(k)
                out.append(APPENDS)
        elif node[0] == "tuple":
            if 1 <= len(node[1]) <= 3 and rng.random() < 0.5:
                for k in node[1]:
                    value(k)
                out.append((TUPLE1, TUPLE2, b"\x87")[len(node[1]) - 1])
            else:
                out.append(MARK)
                for k in node[1]:
                    value(k)
                out.append(TUPLE)
        else:                       # dict, od: an OrderedDict made by REDUCE
            out.append(EMPTY_DICT if node[0] == "dict" else LEAF["odict"])
            out.append(MARK)
            for key, v in node[1]:
                out.append(LEAF[key])
                value(v)
            out.append(SETITEMS)
        if memo[0] < 250 and rng.random() < 0.3:
            out.append(put(memo[0]))
            memo[0] += 1

    value(tree)
    out.append(STOP)
    return b"".join(out)


def same_value(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a is b or a == b


if hypothesis is None:
    def test_property_nvio_refuses_whenever_torch_refuses():
        pytest.skip("hypothesis is not installed")
else:
    def kids_of(kids):
        return st.one_of(
            st.tuples(st.just("list"), st.lists(kids, max_size=4)),
            st.tuples(st.just("dict"), st.lists(st.tuples(st.sampled_from(["str", "int1"]), kids),
                                                max_size=4)),
            st.tuples(st.just("tuple"), st.lists(kids, max_size=5)),
            st.tuples(st.just("od"), st.lists(st.tuples(st.just("str"), kids), max_size=3)),
        )

    TREES = st.recursive(st.sampled_from(sorted(LEAF) + ["ref"]).map(lambda k: (k,)), kids_of,
                         max_leaves=12)

    @hypothesis.settings(max_examples=300, deadline=None, derandomize=True,
                         suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture,
                                                hypothesis.HealthCheck.too_slow])
    @hypothesis.given(tree=TREES, bad=st.sampled_from(sorted(FORBIDDEN) + [None]),
                      at=st.integers(0, 30), seed=st.integers(0, 2 ** 32))
    def test_property_nvio_refuses_whenever_torch_refuses(tmp_path, tree, bad, at, seed):
        """Random pickles of torch's allowed opcodes and globals with one
        forbidden element (or none) at a random node: whenever
        torch.load(weights_only=True) refuses, nvio.load refuses; when torch
        accepts, nvio gives the same object."""
        import random
        import warnings
        pkl = serialize(tree, FORBIDDEN[bad] if bad else b"", at if bad else -1,
                        random.Random(seed))
        p = checkpoint(tmp_path / "h.pt", pkl, {"0": FOUR})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (tv, want), (nv, got) = verdicts(p)
        if tv == "refused":
            assert nv == "refused", \
                "torch refused (%r), nvio.load accepted %r: %r" % (want, got, pkl)
        else:
            assert nv == "ok", "torch accepted, nvio.load refused: %r: %r" % (got, pkl)
            assert same_value(got, want), (got, want, pkl)
