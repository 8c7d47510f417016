"""nvio.data against megatron-core: datasets written by megatron's own
IndexedDatasetBuilder (every dtype it writes, multimodal or not, empty
sequences and documents) read through megatron's IndexedDataset and through
nvio, equal for every sample and access method on every engine and direct
mode; batches equal sample reads; megatron's GPTDataset and BlendedDataset
over nvio (NvioGPTDataset) equal to megatron's own, in a DataLoader with
forked workers too; bad input (truncated .bin, an .idx past the .bin's end,
a wrong dtype code, a truncated .idx, indices out of range) a clear error.

Skipped where megatron-core is not installed."""
import os
import struct
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    mid = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

import nvio.data as nd  # noqa: E402
import nvio.data.megatron as nm  # noqa: E402

DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float64, np.float32, np.uint16]


def build(prefix, dtype, multimodal, seed, docs=12):
    """A dataset written by megatron's builder: random tokens, documents of
    1-3 sequences of 0-60 tokens (an empty document too)."""
    rng = np.random.default_rng(seed)
    b = mid.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype, multimodal=multimodal)
    for d in range(docs):
        for _ in range(0 if d == 3 else int(rng.integers(1, 4))):
            n = int(rng.integers(0, 61))
            b.add_item(torch.from_numpy(rng.integers(0, 120, n)), mode=int(rng.integers(0, 4)))
        b.end_document()
    b.finalize(prefix + ".idx")
    return prefix


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    d = tmp_path_factory.mktemp("mg")
    return [(build(str(d / ("%s_%d" % (np.dtype(t).name, mm))), t, mm, k), mm)
            for k, (t, mm) in enumerate((t, mm) for t in DTYPES for mm in (False, True))]


def same_array(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_every_dtype_and_mode_equals_megatron(datasets, engine, direct):
    rng = np.random.default_rng(7)
    for prefix, mm in datasets:
        ref = mid.IndexedDataset(prefix, multimodal=mm)
        ours = nd.IndexedDataset(prefix, multimodal=mm, engine=engine, direct=direct)
        assert len(ours) == len(ref) and ours.dtype == ref.index.dtype
        assert same_array(ours.sequence_lengths, ref.sequence_lengths)
        assert same_array(ours.document_indices, ref.document_indices)
        assert same_array(ours.get_document_indices(), ref.get_document_indices())
        if mm:
            assert same_array(ours.sequence_modes, ref.index.sequence_modes)
        for i in list(range(len(ref))) + [-1, np.int64(2)]:
            a, b = ref[i], ours[i]
            if mm:
                assert a[1] == b[1]
                a, b = a[0], b[0]
            assert same_array(a, b), (prefix, i)
            n = int(ref.sequence_lengths[i])
            off = int(rng.integers(0, n + 1))
            ln = int(rng.integers(0, n - off + 1))
            for kw in ({"offset": off}, {"offset": off, "length": ln}):
                a, b = ref.get(i, **kw), ours.get(i, **kw)
                if mm:
                    assert a[1] == b[1]
                    a, b = a[0], b[0]
                assert same_array(a, b), (prefix, i, kw)
        for sl in (slice(0, len(ref)), slice(2, 5), slice(4, 4)):
            a, b = ref[sl], ours[sl]
            if mm:
                assert same_array(a[1], b[1])
                a, b = a[0], b[0]
            assert len(a) == len(b) and all(same_array(x, y) for x, y in zip(a, b))
        # a batch: one submission, every sample a view equal to its own read
        idx = list(rng.permutation(len(ref))) + [0, 0, len(ref) - 1]
        batch = ours.read_batch(idx)
        assert len(batch) == len(idx)
        for i, t in zip(idx, batch):
            a = ref[i][0] if mm else ref[i]
            assert same_array(t.numpy(), a), (prefix, i)
        assert len({t.untyped_storage().data_ptr() for t in batch if t.numel()}) <= 1
        ptrs = [t.data_ptr() for t in batch if t.numel()]       # repeats do not alias
        assert len(set(ptrs)) == len(ptrs)


def test_indexed_dataset_in_workers(datasets):
    prefix, _ = datasets[6]              # int32
    ref = mid.IndexedDataset(prefix)
    ours = nd.IndexedDataset(prefix)
    ours.read_batch([0])
    order = [[5, 1, 9], [0, 2], [3, 3, 4]]
    dl = torch.utils.data.DataLoader(ours, batch_sampler=order, num_workers=2,
                                     collate_fn=nd.collate, multiprocessing_context="fork",
                                     timeout=120)
    for b, idx in zip(dl, order):
        assert [t.numpy().tobytes() for t in b] == [ref[i].tobytes() for i in idx]
        assert len({t.untyped_storage().data_ptr() for t in b if t.numel()}) <= 1


def test_a_batch_pickles_as_its_one_buffer(datasets):
    """A batch sent from a DataLoader worker is pickled: as one buffer and
    the samples' places (torch pickles each view with its whole storage:
    a batch of n samples cost n buffers), views of one storage again."""
    import pickle
    prefix, _ = datasets[6]
    ref = mid.IndexedDataset(prefix)
    ours = nd.IndexedDataset(prefix)
    idx = list(range(len(ref))) * 3
    b = ours.read_batch(idx)
    size = b[0].untyped_storage().nbytes()
    raw = pickle.dumps(b)
    assert len(raw) < 2 * size + 4096, (len(raw), size)
    back = pickle.loads(raw)
    assert [t.numpy().tobytes() for t in back] == [ref[i].tobytes() for i in idx]
    assert len({t.untyped_storage().data_ptr() for t in back if t.numel()}) == 1


class Tok:
    """The tokenizer GPTDataset needs: its eod and pad ids."""
    eod = 0
    pad = 1
    vocab_size = 1000
    unique_identifiers = {"class": "Tok"}


def gpt_config(prefixes, weights, mmap=True):
    return GPTDatasetConfig(random_seed=3, sequence_length=48, blend=(prefixes, weights),
                            split="100,0,0", tokenizer=Tok(), reset_position_ids=False,
                            reset_attention_mask=False, eod_mask_loss=True,
                            path_to_cache=None, mmap_bin_files=mmap)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt")
    out = []
    for k in range(2):
        rng = np.random.default_rng(40 + k)
        p = str(d / ("c%d" % k))
        b = mid.IndexedDatasetBuilder(p + ".bin", dtype=np.int32)
        for _ in range(40):
            b.add_item(torch.from_numpy(rng.integers(2, 1000, int(rng.integers(1, 200)))))
            b.end_document()
        b.finalize(p + ".idx")
        out.append(p)
    return out


def same_sample(a, b):
    assert a.keys() == b.keys()
    for k in a:
        x, y = torch.as_tensor(a[k]), torch.as_tensor(b[k])
        assert x.dtype == y.dtype and torch.equal(x, y), k
    return True


def test_gpt_and_blended_datasets_read_through_nvio(corpora):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = BlendedMegatronDatasetBuilder(GPTDataset, [150, 0, 0], lambda: True,
                                            gpt_config(corpora, [0.4, 0.6])).build()[0]
        ours = BlendedMegatronDatasetBuilder(nm.NvioGPTDataset, [150, 0, 0], lambda: True,
                                             gpt_config(corpora, [0.4, 0.6])).build()[0]
    assert type(ours) is type(ref) and len(ours) == len(ref)
    for sub in ours.datasets:
        assert isinstance(sub, nm.NvioGPTDataset)
        assert isinstance(sub.dataset, nm.NvioIndexedDataset)
        assert isinstance(sub.dataset.bin_reader, nm.NvioBinReader)
    for i in range(len(ref)):
        assert same_sample(ref[i], ours[i]), i
    # a GPTDataset's batch: its token ranges in one submission
    sub, rsub = ours.datasets[1], ref.datasets[1]
    idx = list(np.random.default_rng(2).permutation(len(sub))[:24]) + [0, 0]
    for i, s in zip(idx, sub.__getitems__(idx)):
        assert same_sample(rsub[i], s), i
    assert isinstance(sub.dataset.bin_reader, nm.NvioBinReader)     # put back
    # forked DataLoader workers: each opens its own handle
    dl = torch.utils.data.DataLoader(sub, batch_size=8, num_workers=2,
                                     multiprocessing_context="fork", timeout=120)
    k = 0
    for b in dl:
        for j in range(b["tokens"].shape[0]):
            assert torch.equal(b["tokens"][j], torch.as_tensor(rsub[k]["tokens"])), k
            k += 1
    assert k == len(sub)


def test_non_integer_indices_are_refused(one):
    """megatron's __getitem__ raises TypeError for 3.0 and its get NumPy's
    IndexError; nvio.data read it as sample 3. Now SampleTypeError (both),
    for bools too, and for a float token offset or length."""
    ref = mid.IndexedDataset(one)
    ours = nd.IndexedDataset(one)
    for bad in (3.0, np.float64(3), True, np.True_):
        with pytest.raises(TypeError):
            ref[3.0]
        with pytest.raises(IndexError):
            ref.get(3.0)
        for read in (lambda: ours[bad], lambda: ours.get(bad), lambda: ours.read_batch([bad])):
            with pytest.raises(nd.SampleTypeError, match=r"one.bin: sample index .* is no "
                                                         r"integer"):
                read()
    n = int(ref.sequence_lengths[2])
    assert n > 1
    for kw in ({"offset": 1.0}, {"offset": 0, "length": 1.0}, {"length": True}):
        with pytest.raises(nd.SampleTypeError, match="token (offset|length) .* is no integer"):
            ours.get(2, **kw)
    assert same_array(ours.get(np.int32(2), offset=np.int64(1)), ref.get(2, offset=1))


# --- bad input ---------------------------------------------------------------------


@pytest.fixture
def one(tmp_path):
    return build(str(tmp_path / "one"), np.int32, False, 11, docs=6)


def test_truncated_bin(one):
    ds = mid.IndexedDataset(one)
    last = len(ds) - 1
    while ds.sequence_lengths[last] == 0:
        last -= 1
    ptr, n = int(ds.index.sequence_pointers[last]), int(ds.sequence_lengths[last])
    size = ptr + 4 * n
    os.truncate(one + ".bin", size - 2)
    msg = r"one.idx: sequence %d \(bytes %d..%d, %d tokens of int32\) lies past the end of " \
          r".*one.bin \(%d bytes\)" % (last, ptr, size, n, size - 2)
    for make in (nd.IndexedDataset, nm.NvioIndexedDataset):
        with pytest.raises(nd.DataTruncatedError, match=msg) as e:
            make(one)
        assert (e.value.sample, e.value.offset, e.value.nbytes) == (last, ptr, 4 * n)
        assert e.value.path == one + ".bin"


def test_index_past_bin_end(one):
    ds = mid.IndexedDataset(one)
    s = len(ds)
    with open(one + ".idx", "r+b") as f:
        f.seek(34 + 4 * s + 8 * 2)                     # sequence 2's pointer
        f.write(struct.pack("<q", 1 << 40))
    with pytest.raises(nd.DataTruncatedError, match=r"sequence 2 \(bytes %d\.\." % (1 << 40)):
        nd.IndexedDataset(one)
    # pointer + bytes past INT64_MAX wraps negative: still past the end
    n = int(ds.sequence_lengths[2]) * 4                # int32 tokens
    assert n > 0
    with open(one + ".idx", "r+b") as f:
        f.seek(34 + 4 * s + 8 * 2)
        f.write(struct.pack("<q", (1 << 63) - n // 2 - 1))
    with pytest.raises(nd.DataTruncatedError, match=r"sequence 2 \(bytes %d\.\.%d,"
                       % ((1 << 63) - n // 2 - 1, (1 << 63) - n // 2 - 1 + n)):
        nd.IndexedDataset(one)
    with open(one + ".idx", "r+b") as f:
        f.seek(34 + 4 * s + 8 * 2)
        f.write(struct.pack("<q", -8))
    with pytest.raises(nd.DataFormatError, match="sequence 2 has a negative offset"):
        nm.NvioIndexedDataset(one)


def test_wrong_dtype_code_and_bad_headers(one):
    raw = open(one + ".idx", "rb").read()
    cases = [(raw[:17] + b"\x09" + raw[18:], nd.DataFormatError,
              "unknown dtype code 9 at offset 17"),
             (raw[:17] + b"\x00" + raw[18:], nd.DataFormatError, "unknown dtype code 0"),
             (b"XXIDX\x00\x00\x00\x00" + raw[9:], nd.DataFormatError, "no Megatron index"),
             (raw[:9] + struct.pack("<Q", 2) + raw[17:], nd.DataFormatError, "index version 2"),
             (raw[:20], nd.DataTruncatedError, "the index is truncated: 20 bytes"),
             (raw[:-5], nd.DataTruncatedError, "the index is truncated: %d bytes" % (len(raw) - 5))]
    for data, cls, msg in cases:
        with open(one + ".idx", "wb") as f:
            f.write(data)
        for make in (nd.IndexedDataset, nm.NvioIndexedDataset):
            with pytest.raises(cls, match=msg) as e:
                make(one)
            assert one + ".idx" in str(e.value)
    # document indices that do not end at the sequence count
    s = struct.unpack_from("<Q", raw, 18)[0]
    d = struct.unpack_from("<Q", raw, 26)[0]
    with open(one + ".idx", "wb") as f:
        end = 34 + 12 * s + 8 * d
        f.write(raw[:end - 8] + struct.pack("<q", s + 1) + raw[end:])
    with pytest.raises(nd.DataFormatError, match="document indices must rise from 0 to the "
                                                 "sequence count %d" % s):
        nd.IndexedDataset(one)


def test_index_out_of_range(one):
    ds = nd.IndexedDataset(one)
    n = len(ds)
    for bad in (n, -n - 1):
        with pytest.raises(nd.SampleIndexError, match=r"one.bin: sample %d out of range: the "
                                                      r"dataset has %d samples" % (bad, n)):
            ds[bad]
        with pytest.raises(IndexError):
            ds.read_batch([0, bad])
    k = int(np.argmax(ds.sequence_lengths))
    ln = int(ds.sequence_lengths[k])
    with pytest.raises(nd.SampleIndexError, match="tokens 1..%d of sequence %d, which has %d"
                                                  % (ln + 1, k, ln)):
        ds.get(k, offset=1, length=ln)
    with pytest.raises(nd.SampleIndexError, match="lie outside its"):
        nm.NvioIndexedDataset(one).bin_reader.read(np.int32, 10, os.path.getsize(one + ".bin"))
    assert sum(1 for _ in ds) == n       # iteration by __getitem__ stops at IndexError


def test_split_batches_from_two_threads_share_one_low_level_dataset(corpora):
    """train/valid/test GPTDatasets share one low-level dataset: batches read
    from two threads at once each equal megatron's own samples (the batch
    reader was once swapped on the shared dataset in place, so one thread's
    samples were read through another's recording pass: zeros)."""
    import sys
    import threading
    sizes = [120, 60, 60]
    cfg = lambda: GPTDatasetConfig(random_seed=5, sequence_length=32, blend=([corpora[0]], None),
                                   split="50,25,25", tokenizer=Tok(), reset_position_ids=False,
                                   reset_attention_mask=False, eod_mask_loss=True,
                                   path_to_cache=None, mmap_bin_files=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, cfg()).build()
        ours = BlendedMegatronDatasetBuilder(nm.NvioGPTDataset, sizes, lambda: True,
                                             cfg()).build()
    train, valid = ours[0], ours[1]
    assert train.dataset is valid.dataset and isinstance(train, nm.NvioGPTDataset)
    want = [[ref[k][i] for i in range(len(ref[k]))] for k in (0, 1)]
    bad, errors = [], []
    go = threading.Barrier(2)

    def reader(k, ds):
        try:
            go.wait(timeout=60)
            rng = np.random.default_rng(k)
            for _ in range(200):
                idx = [int(i) for i in rng.integers(0, len(ds), 8)]
                for i, s in zip(idx, ds.__getitems__(idx)):
                    if not torch.equal(s["tokens"], torch.as_tensor(want[k][i]["tokens"])):
                        bad.append((k, i))
        except Exception as e:                  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        ts = [threading.Thread(target=reader, args=(k, ds)) for k, ds in enumerate((train, valid))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
    finally:
        sys.setswitchinterval(old)
    assert not errors and not bad, (errors, bad[:5], len(bad))
    assert isinstance(train.dataset.bin_reader, nm.NvioBinReader)
    for i in range(len(train)):                 # nothing left swapped in
        assert same_sample(want[0][i], train[i]), i
