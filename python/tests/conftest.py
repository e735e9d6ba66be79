"""Shared fixtures: the bundled dataset's cache, built once per test session."""

import os
import pathlib

import pytest

import voxcache

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("voxcache") / "cache"
    report = voxcache.build_cache(ROOT / "data" / "vessels", d, jobs=2)
    assert report["failed"] == 0 and report["built"] == 10, report
    return os.fspath(d)


@pytest.fixture(scope="session")
def cache(cache_dir):
    return voxcache.open(cache_dir)
