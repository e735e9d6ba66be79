"""A cache of nnU-Net's preprocessing built from Python (``nnunet_plans=``), read back with
zarr-python and compared with nnunetv2 2.8.1's own preprocessed arrays (the fixture of
tests/suite/nnunet_cache.rs, made by scripts/nnunet_cache_check.py)."""

import os
import pathlib
import shutil
import zipfile

import numpy as np
import pytest

import voxcache

zarr = pytest.importorskip("zarr")

FIXTURE = pathlib.Path(__file__).resolve().parents[2] / "tests/fixtures/nnunet_preprocessed"


def expected(name, case_id):
    with np.load(FIXTURE / name / "expected" / f"{case_id}.npz") as z:
        return z["data"], z["seg"]


@pytest.mark.parametrize("name", ["Dataset991_CacheCT", "Dataset992_CacheMR"])
def test_a_cache_from_plans_is_nnunets_arrays(tmp_path, name):
    data = tmp_path / "raw"
    shutil.copytree(FIXTURE / name, data)
    report = voxcache.build_cache(data, tmp_path / "cache", nnunet_plans=data / "nnUNetPlans.json",
                                  configuration="3d_fullres", jobs=1)
    assert report["failed"] == 0 and report["built"] == len(os.listdir(FIXTURE / name / "expected"))
    cache = voxcache.open(tmp_path / "cache")
    for case_id in cache.cases():
        want, seg = expected(name, case_id)
        case = cache[case_id]
        image = case.image[...]
        assert image.shape == want.shape
        scale = np.abs(want).max(axis=(1, 2, 3), keepdims=True)
        assert (np.abs(image - want) / scale).max() <= 1e-4, case_id
        np.testing.assert_array_equal(case.label[...], np.maximum(seg, 0).astype(np.uint16))
        # nnU-Net's normalization mask where its plans normalize within it (the MR-like set).
        if name == "Dataset992_CacheMR":
            assert case.norm_mask_channels == [0, 1]
            np.testing.assert_array_equal(case.norm_mask[...], (seg >= 0).astype(np.uint8))
            assert 0 < case.norm_mask[...].sum() < seg.size
        else:
            assert case.norm_mask_channels == [] and case.norm_mask is None


def test_options_the_plans_decide_are_refused_by_keyword(tmp_path):
    data = tmp_path / "raw"
    shutil.copytree(FIXTURE / "Dataset991_CacheCT", data)
    with pytest.raises(voxcache.ConfigError, match="spacing=.*nnunet_plans="):
        voxcache.build_cache(data, tmp_path / "cache", nnunet_plans=data / "nnUNetPlans.json",
                             spacing=(1, 1, 1))
    assert not (tmp_path / "cache").exists()
    # The same refusals as the command line's, by keyword: a previous stage, a cache on S3.
    with pytest.raises(voxcache.ConfigError, match="previous_stage=.*nnunet_plans="):
        voxcache.build_cache(data, tmp_path / "cache", nnunet_plans=data / "nnUNetPlans.json",
                             previous_stage=tmp_path)
    with pytest.raises(voxcache.ConfigError, match="nnunet_plans=.*S3"):
        voxcache.build_cache(data, "s3://bucket/cache", nnunet_plans=data / "nnUNetPlans.json",
                             s3_endpoint="http://127.0.0.1:9")
    assert not (tmp_path / "cache").exists()
