"""PatchLoader.for_train gives a `train` run's own batches: the CLI trainer records a BLAKE3
hash of each batch it trains on (`train --batch-hashes`), and the Python loader's batches, built
from the same options, hash to the same values, batch for batch; with augmentation, a fold, the
derived arrays a loss needs, and a cascade's previous-stage channels."""

import json
import os
import pathlib
import shutil
import subprocess

import blake3
import numpy as np
import pytest

import voxcache

ROOT = pathlib.Path(__file__).resolve().parents[2]


def train_binary() -> str:
    """The newest `train` binary built here (`cargo test` builds one in CI), else one built now."""
    built = [p for p in (ROOT / "target" / d / "train" for d in ("debug", "release")) if p.is_file()]
    if not built:
        subprocess.run(["cargo", "build", "--quiet", "--bin", "train"], cwd=ROOT, check=True)
        return os.fspath(ROOT / "target" / "debug" / "train")
    return os.fspath(max(built, key=lambda p: p.stat().st_mtime))


def cli_hashes(cache_dir, args, run_dir) -> dict:
    """Each batch's hash as the CLI trainer recorded it, by batch number."""
    cmd = [train_binary(), "--cache-dir", os.fspath(cache_dir), "--out", os.fspath(run_dir),
           "--batch-hashes", "--no-progress", "-j", "1", "--val-every", "0",
           "--no-fold-validation", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = (run_dir / "batch_hashes.jsonl").read_text().splitlines()
    return {r["batch"]: r["hash"] for r in map(json.loads, lines)}


def loader_hashes(loader) -> dict:
    out = {}
    for b in loader:
        h = blake3.blake3(np.ascontiguousarray(b["image"], dtype="<f4").tobytes())
        h.update(np.ascontiguousarray(b["label"], dtype="<u2").tobytes())
        out[b["step"]] = h.hexdigest()
    return out


def run(**changes) -> list:
    """train's options for a small run, `changes` replacing or adding some (None: flag only)."""
    opts = {"steps": "3", "patch": "16,32,32", "batch_size": "2", "fold": "1", "seed": "7",
            "base_channels": "4", "stages": "3", **changes}
    args = []
    for key, value in opts.items():
        args.append("--" + key.replace("_", "-"))
        if value is not None:
            args.append(value)
    return args


RUN = run()


def test_augmented_fold_batches_equal_the_cli_trainers(cache_dir, tmp_path):
    want = cli_hashes(cache_dir, run(workers="1"), tmp_path / "run")
    assert sorted(want) == [0, 1, 2]
    for threads in (1, 3):
        loader = voxcache.PatchLoader.for_train(voxcache.open(cache_dir), RUN, threads=threads)
        assert len(loader) == 3
        assert loader_hashes(loader) == want
    # Resuming the stream at a batch gives that batch on.
    later = voxcache.PatchLoader.for_train(voxcache.open(cache_dir), RUN, first_step=2)
    assert loader_hashes(later) == {2: want[2]}
    # Another seed draws other batches (the hash sees the data).
    other = voxcache.PatchLoader.for_train(voxcache.open(cache_dir), run(seed="8"))
    assert loader_hashes(other)[0] != want[0]


def test_the_fold_decides_the_cases(cache_dir):
    loader = voxcache.PatchLoader.for_train(voxcache.open(cache_dir), run(steps="20"))
    # nnU-Net's five folds of the ten bundled cases: two held out by each fold.
    held_out = set(voxcache.open(cache_dir).cases()) - set(loader.case_ids)
    assert len(held_out) == 2, held_out
    other = voxcache.PatchLoader.for_train(voxcache.open(cache_dir), run(fold="2"))
    assert set(voxcache.open(cache_dir).cases()) - set(other.case_ids) != held_out
    for b in loader:
        assert not set(b["case"]) & held_out


def test_a_loss_with_derived_targets_gets_them(tmp_path):
    cache_dir = tmp_path / "cache"
    report = voxcache.build_cache(ROOT / "data" / "vessels", cache_dir, derived="distance", jobs=2)
    assert report["failed"] == 0, report
    args = run(loss="skeleton_recall=1") + ["--loss", "boundary=0.5"]
    want = cli_hashes(cache_dir, args, tmp_path / "run")
    loader = voxcache.PatchLoader.for_train(voxcache.open(cache_dir), args, threads=2)
    assert loader.distance_labels == [1]
    got = {}
    for b in loader:
        assert b["distance"].shape == (2, 1, 16, 32, 32) and b["distance"].dtype == np.float32
        assert b["skeleton"].shape == (2, 16, 32, 32)
        # The tubed skeleton lies on the label.
        assert not (b["skeleton"] > 0)[b["label"] != 1].any()
        got.update(loader_hashes([b]))
    assert got == want
    # Unaugmented, the distance maps are the cached ones: signed, negative inside the label.
    raw = voxcache.PatchLoader.for_train(voxcache.open(cache_dir), args + ["--no-augment"])
    for b in raw:
        inside = b["label"] == 1
        assert (b["distance"][:, 0][inside] < 0).all()
        assert (b["distance"][:, 0][~inside] >= 0).all()


def test_cascade_channels_equal_the_cli_trainers(tmp_path):
    # A previous stage that segmented every case exactly as labelled: its channels are then
    # the label's indicator, moved and perturbed as the trainer perturbs them.
    data = ROOT / "data" / "vessels"
    previous = tmp_path / "previous"
    shutil.copytree(data / "labelsTr", previous)
    cache_dir = tmp_path / "cascade-cache"
    report = voxcache.build_cache(data, cache_dir, previous_stage=previous, jobs=2)
    assert report["failed"] == 0, report
    want = cli_hashes(cache_dir, RUN, tmp_path / "run")
    cache = voxcache.open(cache_dir)
    loader = voxcache.PatchLoader.for_train(cache, RUN, threads=2)
    assert loader_hashes(loader) == want
    raw = voxcache.PatchLoader.for_train(cache, run(no_augment=None), threads=1)
    for b in raw:
        image = b["image"]
        assert image.shape == (2, 2, 16, 32, 32)
        # Without augmentation the previous stage's channel is the label's indicator.
        np.testing.assert_array_equal(image[:, 1], (b["label"] == 1).astype(np.float32))


def test_train_options_are_checked(cache, monkeypatch):
    with pytest.raises(voxcache.VoxcacheError, match="--no-such-flag"):
        voxcache.PatchLoader.for_train(cache, ["--no-such-flag"])
    with pytest.raises(voxcache.VoxcacheError, match="give one fold"):
        voxcache.PatchLoader.for_train(cache, run(fold="0,1"))
    with pytest.raises(voxcache.VoxcacheError, match="deep_supervision"):
        voxcache.PatchLoader.for_train(cache, RUN, deep_supervision=[(1, 2, 2)])
    # Under several ranks every rank would get the one stream: refused.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(voxcache.VoxcacheError, match="one process's stream"):
        voxcache.PatchLoader.for_train(cache, RUN)
