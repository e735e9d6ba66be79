"""The cache from Python: build, inspect, open, read; checked against zarr-python's reading of
the same entries and against the library's own reader through another path."""

import gc
import json
import os
import pathlib
import shutil

import numpy as np
import pytest

import voxcache

zarr = pytest.importorskip("zarr")


def zarr_box(array, start, size):
    """A box of a zarr array (z, y, x on its last three axes), zero outside the grid."""
    shape = array.shape[-3:]
    out = np.zeros(tuple(array.shape[:-3]) + tuple(size), dtype=array.dtype)
    src, dst = [], []
    for s, n, dim in zip(start, size, shape):
        lo, hi = max(s, 0), min(s + n, dim)
        if hi <= lo:
            return out
        src.append(slice(lo, hi))
        dst.append(slice(lo - s, hi - s))
    lead = (slice(None),) * (array.ndim - 3)
    out[lead + tuple(dst)] = array[lead + tuple(src)]
    return out


def entry_arrays(cache_dir, case_id):
    manifest = json.load(open(os.path.join(cache_dir, "manifest.json")))
    (dataset,) = manifest["datasets"].values()
    entry = os.path.join(cache_dir, dataset["cases"][case_id]["entry"])
    return zarr.open_array(os.path.join(entry, "image"), mode="r"), zarr.open_array(
        os.path.join(entry, "label"), mode="r"
    )


def test_cases_and_geometry(cache, cache_dir):
    assert cache.datasets == ["vessels"]
    assert len(cache) == 10 and cache.cases()[0] == "vessels_000"
    report = voxcache.inspect(cache_dir)
    assert report["kind"] == "cache"
    case = cache["vessels_003"]
    image, label = entry_arrays(cache_dir, "vessels_003")
    assert tuple(case.shape) == image.shape[1:] == label.shape
    assert case.channels == image.shape[0] == 1
    assert case.unit == "um" and case.has_label and len(case.key) == 64


def test_slicing_equals_zarr_python(cache, cache_dir):
    image, label = entry_arrays(cache_dir, "vessels_001")
    case = cache["vessels_001"]
    z, y, x = case.shape
    got = case.image[0, 3 : z - 2, 5:17, :]
    assert got.dtype == np.float32 and got.shape == (z - 5, 12, x)
    np.testing.assert_array_equal(got, image[0, 3 : z - 2, 5:17, :])
    np.testing.assert_array_equal(case.label[...], label[...].astype(np.uint16))
    np.testing.assert_array_equal(case.label[-1], label[-1].astype(np.uint16))
    # A box reaching outside the grid reads zero there.
    start, size = (-4, y - 10, -3), (12, 20, 9)
    np.testing.assert_array_equal(case.read_image(start, size), zarr_box(image, start, size))


def test_raw_batches_equal_zarr_python_at_their_origins(cache, cache_dir):
    loader = voxcache.PatchLoader(cache, patch_size=(16, 48, 48), batch_size=3, steps=6, seed=0)
    assert len(loader) == 6
    seen = 0
    for b in loader:
        assert b["image"].shape == (3, 1, 16, 48, 48) and b["image"].dtype == np.float32
        assert b["label"].shape == (3, 16, 48, 48) and b["label"].dtype == np.uint16
        assert b["origin"].shape == (3, 3) and b["origin"].dtype == np.int64
        for i, case in enumerate(b["case"]):
            image, label = entry_arrays(cache_dir, case)
            o = b["origin"][i].tolist()
            np.testing.assert_array_equal(b["image"][i], zarr_box(image, o, (16, 48, 48)))
            np.testing.assert_array_equal(
                b["label"][i], zarr_box(label, o, (16, 48, 48)).astype(np.uint16)
            )
            seen += 1
    assert seen == 18


def test_batches_depend_on_the_seed_not_the_threads(cache):
    def batches(threads, seed):
        out = []
        for b in voxcache.PatchLoader(
            cache, (16, 32, 32), 2, augment="default", threads=threads, seed=seed, steps=4
        ):
            out.append((b["image"].copy(), b["label"].copy(), b["origin"].copy(), b["case"]))
        return out

    one, three = batches(1, 7), batches(3, 7)
    for a, b in zip(one, three):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(a[2], b[2])
        assert a[3] == b[3]
    other = batches(1, 8)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(one, other))
    # Augmented patches are not the raw boxes (the default mirrors, rotates, adds noise...).
    assert any(b[0].std() > 0 for b in one)


def test_ranks_together_draw_one_processs_batches(cache, monkeypatch):
    """Two ranks of batch 3 (as under torchrun) see, step by step, the batch of 6 one process
    draws: the same cases, origins, augmented voxels and foreground share."""

    def batches(batch, **shard):
        out = []
        for b in voxcache.PatchLoader(
            cache, (16, 32, 32), batch, augment="default", threads=2, seed=5, steps=3, **shard
        ):
            out.append((b["image"].copy(), b["label"].copy(), b["origin"].copy(), b["case"]))
        return out

    whole = batches(6)
    ranks = [batches(3, rank=r, world_size=2) for r in range(2)]
    for step, w in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([r[step][0] for r in ranks]), w[0])
        np.testing.assert_array_equal(np.concatenate([r[step][1] for r in ranks]), w[1])
        np.testing.assert_array_equal(np.concatenate([r[step][2] for r in ranks]), w[2])
        assert ranks[0][step][3] + ranks[1][step][3] == w[3]
    # The ranks do not repeat each other.
    assert not np.array_equal(ranks[0][0][0], ranks[1][0][0])
    # torchrun's environment is read when the rank is not given.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = voxcache.PatchLoader(cache, (16, 32, 32), 3, augment="default", seed=5, steps=1)
    assert (loader.rank, loader.world_size) == (1, 2)
    np.testing.assert_array_equal(next(iter(loader))["origin"], ranks[1][0][2])
    with pytest.raises(voxcache.ConfigError, match="rank 2 of a world of 2"):
        voxcache.PatchLoader(cache, (16, 32, 32), 3, rank=2, world_size=2)


def pooled(t, f):
    """The trainer's pooling of class indices (B, z, y, x; -100 ignored) by factors f, computed
    another way: a coarse voxel takes the foreground class most of its fine voxels hold (ties to
    the lower class), else -100 when all are ignored, else 0."""
    b, z, y, x = t.shape
    blocks = t.reshape(b, z // f[0], f[0], y // f[1], f[1], x // f[2], f[2])
    blocks = blocks.transpose(0, 1, 3, 5, 2, 4, 6).reshape(b, z // f[0], y // f[1], x // f[2], -1)
    out = np.zeros(blocks.shape[:4], np.int64)
    for idx in np.ndindex(*blocks.shape[:4]):
        v = blocks[idx]
        fg = v[v > 0]
        if fg.size:
            out[idx] = int(np.argmax(np.bincount(fg)))
        elif (v == -100).all():
            out[idx] = -100
    return out


def test_targets_are_the_trainers_class_indices(tmp_path):
    """Labels 0, 2, 5 and an ignore label 9: ``target`` holds classes 0, 1, 2 and -100 where
    the label does, as the trainer maps them."""
    nib = pytest.importorskip("nibabel")
    data = tmp_path / "data"
    (data / "imagesTr").mkdir(parents=True)
    (data / "labelsTr").mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        image = rng.normal(size=(40, 40, 20)).astype(np.float32)
        label = np.zeros((40, 40, 20), np.uint8)
        label[5:20, 5:20, 2:10] = 2
        label[20:35, 10:30, 8:16] = 5
        label[0:4, :, :] = 9
        affine = np.diag([1.0, 1.0, 2.0, 1.0])
        nib.save(nib.Nifti1Image(image, affine), data / "imagesTr" / f"c_{i:03d}_0000.nii.gz")
        nib.save(nib.Nifti1Image(label, affine), data / "labelsTr" / f"c_{i:03d}.nii.gz")
    (data / "dataset.json").write_text(json.dumps({
        "channel_names": {"0": "noise"},
        "labels": {"background": 0, "a": 2, "b": 5, "ignore": 9},
        "numTraining": 2, "file_ending": ".nii.gz"}))
    voxcache.build_cache(data, tmp_path / "cache")
    loader = voxcache.PatchLoader(tmp_path / "cache", (8, 24, 24), 4, targets=True, steps=6, seed=1)
    assert loader.classes == [(0, "background"), (2, "a"), (5, "b")]
    seen = set()
    for b in loader:
        want = np.select([b["label"] == 2, b["label"] == 5, b["label"] == 9], [1, 2, -100], 0)
        assert b["target"].dtype == np.int64
        np.testing.assert_array_equal(b["target"], want)
        seen |= set(np.unique(b["target"]).tolist())
    assert seen == {-100, 0, 1, 2}
    assert voxcache.PatchLoader(tmp_path / "cache", (8, 24, 24), 4, steps=1).classes is None

    # Deep-supervision targets: the pooling rule, computed here another way.
    factors = [(1, 2, 2), (2, 4, 4)]
    loader = voxcache.PatchLoader(tmp_path / "cache", (8, 24, 24), 2, targets=True, steps=3,
                                  seed=2, deep_supervision=factors)
    for b in loader:
        assert [t.shape for t in b["target_ds"]] == [(2, 8, 12, 12), (2, 4, 6, 6)]
        for t, f in zip(b["target_ds"], factors):
            np.testing.assert_array_equal(t, pooled(b["target"], f))
    with pytest.raises(voxcache.ConfigError, match="divide the patch"):
        voxcache.PatchLoader(tmp_path / "cache", (8, 24, 24), 2, targets=True, deep_supervision=[(3, 2, 2)])


def test_region_targets_are_nnunets(tmp_path):
    """A BraTS-style dataset (regions 1+2+3, 2+3, 3; ignore label 4): ``target`` is each
    region's membership, then the ignore label's channel, at every deep-supervision level."""
    nib = pytest.importorskip("nibabel")
    data = tmp_path / "data"
    (data / "imagesTr").mkdir(parents=True)
    (data / "labelsTr").mkdir()
    rng = np.random.default_rng(1)
    for i in range(2):
        image = rng.normal(size=(32, 32, 16)).astype(np.float32)
        label = np.zeros((32, 32, 16), np.uint8)
        label[4:28, 4:28, 2:14] = 1
        label[8:24, 8:24, 4:12] = 3
        label[12:20, 12:20, 6:10] = 2
        label[0:6, :, :] = 4  # wide enough that random patches reach it (it is never a centre)
        affine = np.eye(4)
        nib.save(nib.Nifti1Image(image, affine), data / "imagesTr" / f"b_{i:03d}_0000.nii.gz")
        nib.save(nib.Nifti1Image(label, affine), data / "labelsTr" / f"b_{i:03d}.nii.gz")
    (data / "dataset.json").write_text(json.dumps({
        "channel_names": {"0": "FLAIR"},
        "labels": {"background": 0, "whole tumor": [1, 2, 3], "tumor core": [2, 3],
                   "enhancing tumor": 3, "ignore": 4},
        "regions_class_order": [1, 2, 3], "numTraining": 2, "file_ending": ".nii.gz"}))
    voxcache.build_cache(data, tmp_path / "cache")
    factors = [(1, 2, 2), (2, 4, 4)]
    loader = voxcache.PatchLoader(tmp_path / "cache", (8, 16, 16), 3, targets=True, steps=4,
                                  seed=3, deep_supervision=factors)
    regions = [[1, 2, 3], [2, 3], [3]]
    assert loader.regions == [("whole tumor", regions[0]), ("tumor core", regions[1]),
                              ("enhancing tumor", regions[2])]

    def membership(label, ignored):
        planes = [np.isin(label, r) & ~ignored for r in regions] + [ignored]
        return np.stack(planes, axis=1).astype(np.uint8)

    seen = np.zeros(4, bool)
    for b in loader:
        label = b["label"].astype(np.int64)
        assert b["target"].dtype == np.uint8 and b["target"].shape == (3, 4, 8, 16, 16)
        np.testing.assert_array_equal(b["target"], membership(label, label == 4))
        seen |= b["target"].any(axis=(0, 2, 3, 4))
        classes = np.where(label == 4, -100, label)
        for t, f in zip(b["target_ds"], factors):
            p = pooled(classes, f)
            np.testing.assert_array_equal(t, membership(p, p == -100))
    assert seen.all()


def test_a_fold_draws_only_its_cases(cache):
    ids = ["vessels_002", "vessels_007"]
    loader = voxcache.PatchLoader(cache, (8, 32, 32), 4, cases=ids, steps=5)
    assert loader.case_ids == ids
    assert {c for b in loader for c in b["case"]} <= set(ids)


def test_bad_arguments_are_clear_errors(cache, cache_dir, tmp_path):
    with pytest.raises(voxcache.CacheError, match="not found"):
        voxcache.open(tmp_path / "nothing")
    with pytest.raises(voxcache.ConfigError, match="spacing"):
        voxcache.build_cache(cache_dir, tmp_path / "c", spacing="x")
    # Options are named as the keywords that give them, not as command-line flags.
    with pytest.raises(voxcache.ConfigError, match="unexpected argument 'no_such_option='"):
        voxcache.build_cache(cache_dir, tmp_path / "c", no_such_option=3)
    with pytest.raises(voxcache.ConfigError, match="for 'jobs='") as e:
        voxcache.build_cache(cache_dir, tmp_path / "c", jobs="many")
    assert "--" not in str(e.value)
    with pytest.raises(voxcache.ConfigError, match="local_cache_gb= does not apply to a local path"):
        voxcache.build_cache(cache_dir, tmp_path / "c", local_cache_gb=3)
    with pytest.raises(voxcache.ConfigError, match="ghost"):
        voxcache.PatchLoader(cache, (8, 32, 32), 2, cases=["ghost"])
    with pytest.raises(voxcache.ConfigError, match="patch_size"):
        voxcache.PatchLoader(cache, (32, 32), 2)
    with pytest.raises(voxcache.ConfigError, match="rotation_prob"):
        voxcache.PatchLoader(cache, (8, 32, 32), 2, augment={"spatial": {"rotation_prob": 2}})
    with pytest.raises(IndexError):
        cache["vessels_000"].image[0, ::2]
    with pytest.raises(voxcache.VoxcacheError):
        cache.case("ghost")


def test_a_damaged_chunk_is_named(cache_dir, tmp_path):
    copy = tmp_path / "cache"
    shutil.copytree(cache_dir, copy)
    manifest = json.load(open(copy / "manifest.json"))
    entry = copy / manifest["datasets"]["vessels"]["cases"]["vessels_004"]["entry"]
    chunk = next(p for p in (entry / "image").rglob("*") if p.is_file() and p.name != "zarr.json")
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    case = voxcache.open(copy)["vessels_004"]
    with pytest.raises(voxcache.VoxcacheError) as e:
        case.image[...]
    message = str(e.value)
    assert "vessels_004" in message and "corrupt" in message, message
    assert os.path.relpath(chunk, entry) in message, message


def test_reused_buffers_give_the_same_batches_and_spare_held_ones(cache):
    """A batch's buffers go back to the loader's threads once Python lets go of them: batches
    dropped at once give the same values as batches all kept, and a kept batch is never
    overwritten by a later one."""
    args = dict(patch_size=(16, 32, 32), batch_size=2, augment="default", threads=2, seed=3, steps=12)
    kept = list(voxcache.PatchLoader(cache, **args))
    dropped = [(b["image"].copy(), b["label"].copy()) for b in voxcache.PatchLoader(cache, **args)]
    held, copies = [], []
    for i, b in enumerate(voxcache.PatchLoader(cache, **args)):
        if i % 3 == 0:
            held.append(b)
            copies.append((b["image"].copy(), b["label"].copy()))
    for i, (k, d) in enumerate(zip(kept, dropped)):
        np.testing.assert_array_equal(k["image"], d[0], err_msg=f"batch {i}")
        np.testing.assert_array_equal(k["label"], d[1], err_msg=f"batch {i}")
    for b, (image, label) in zip(held, copies):
        np.testing.assert_array_equal(b["image"], image)
        np.testing.assert_array_equal(b["label"], label)
    # Arrays are writable, as numpy's own.
    held[0]["image"][...] = 0


def _rss_and_threads():
    """This process's resident memory (bytes) and thread count, from /proc (Linux)."""
    status = pathlib.Path("/proc/self/status").read_text()
    rss = int(next(l.split()[1] for l in status.splitlines() if l.startswith("VmRSS:")))
    return rss * 1024, len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc (Linux)")
def test_loaders_come_and_go(cache):
    """Loaders made and dropped by the hundred (as a notebook or a DataLoader re-iterated per
    epoch does) leave no thread behind and no growing memory; batches kept alive stay valid."""

    def churn(n):
        kept = None
        for _ in range(n):
            loader = voxcache.PatchLoader(cache, (8, 32, 32), 2, augment="default", threads=2, steps=2)
            kept = next(iter(loader))
            del loader
        return kept

    churn(20)
    gc.collect()
    rss0, threads0 = _rss_and_threads()
    kept = churn(200)
    gc.collect()
    rss1, threads1 = _rss_and_threads()
    assert threads1 == threads0, (threads0, threads1)
    assert rss1 - rss0 < 32 << 20, f"resident memory grew by {(rss1 - rss0) >> 20} MiB over 200 loaders"
    # The last batch outlives its loader: numpy owns its buffer.
    assert kept["image"].shape == (2, 1, 8, 32, 32) and np.isfinite(kept["image"]).all()


def test_derived_arrays_equal_zarr_python(tmp_path, cache):
    plain_cache = cache
    root = pathlib.Path(__file__).resolve().parents[2]
    cache_dir = tmp_path / "cache"
    voxcache.build_cache(root / "data" / "vessels", cache_dir, derived="distance,skeleton", jobs=2)
    cache = voxcache.open(cache_dir)
    case = cache["vessels_002"]
    manifest = json.load(open(cache_dir / "manifest.json"))
    (dataset,) = manifest["datasets"].values()
    entry = cache_dir / dataset["cases"]["vessels_002"]["entry"]
    distance = zarr.open_array(str(entry / "distance"), mode="r")
    skeleton = zarr.open_array(str(entry / "skeleton"), mode="r")
    assert case.distance_labels == [1] and distance.shape[0] == 1
    np.testing.assert_array_equal(case.distance[...], distance[...])
    np.testing.assert_array_equal(case.distance[0, 2:5], distance[0, 2:5])
    np.testing.assert_array_equal(case.skeleton[...], skeleton[...].astype(np.uint16))
    assert case.skeleton[...].any() and case.norm_mask is None and case.norm_mask_channels == []
    # A box reaching outside the grid reads zero there.
    start, size = (-2, 3, -4), (6, 10, 12)
    np.testing.assert_array_equal(case._inner.read_distance(1, start, size), zarr_box(distance, start, size)[0])
    # A cache built without derived arrays has none.
    plain = plain_cache["vessels_002"]
    assert plain.distance is None and plain.skeleton is None and plain.distance_labels == []


def test_mapped_pages_can_be_bounded(cache, cache_dir):
    # A reader that hands its mapped pages back after about 1 MiB reads the same batches.
    bounded = voxcache.open(cache_dir, mapped_mib=1)
    a = voxcache.PatchLoader(cache, (16, 48, 48), 2, augment="default", threads=1, seed=5, steps=8)
    b = voxcache.PatchLoader(bounded, (16, 48, 48), 2, augment="default", threads=1, seed=5, steps=8)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["image"], y["image"])
        np.testing.assert_array_equal(x["label"], y["label"])
    for bad in (0, -3, True):
        with pytest.raises(voxcache.ConfigError, match="mapped_mib"):
            voxcache.open(cache_dir, mapped_mib=bad)
