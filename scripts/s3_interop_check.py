#!/usr/bin/env python3
"""zarr-python reads a cache that `prep build-cache` wrote to S3 as it reads the local one.

Builds the bundled dataset twice per layout (plain chunks; zstd chunks in shards): once into
s3://BUCKET/PREFIX on an S3-compatible server, once into a local folder. Then opens every
entry's group over S3 with zarr-python (zarr.storage.ObjectStore over obstore's S3Store) and
locally (LocalStore), and checks that both hold the same arrays with equal shapes, dtypes and
values, and that the S3 manifest equals the local one. Exit 1 on any difference.

    python3 scripts/s3_interop_check.py --prep target/debug/prep \\
        --endpoint http://127.0.0.1:8333 --bucket voxtest
Credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (as prep takes them).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import zarr
from obstore.store import S3Store
from zarr.storage import LocalStore, ObjectStore

LAYOUTS = [("plain", []), ("shard.zstd", ["--chunk", "16,32,32", "--shard", "32,128,128",
                                          "--compression", "zstd"])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", default="target/debug/prep")
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--data", default="data/vessels")
    a = ap.parse_args()
    env = dict(os.environ, AWS_ENDPOINT_URL=a.endpoint)
    run_id = f"interop-{os.getpid()}-{int(time.time())}"
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in LAYOUTS:
            prefix = f"{run_id}/{name}"
            local = os.path.join(tmp, name)
            for dest in (f"s3://{a.bucket}/{prefix}", local):
                # --local-cache (where entries are staged) applies to a cache on S3 only.
                stage = ["--local-cache", os.path.join(tmp, "stage")] if dest.startswith("s3://") else []
                subprocess.run([a.prep, "build-cache", a.data, "--cache-dir", dest, "-q",
                                *stage, *flags],
                               check=True, env=env, stdout=subprocess.DEVNULL)
            s3 = S3Store(a.bucket, prefix=prefix, endpoint=a.endpoint,
                         access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                         secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                         region=os.environ.get("AWS_REGION", "us-east-1"),
                         client_options={"allow_http": True})
            remote_manifest = json.loads(bytes(s3.get("manifest.json").bytes()))
            with open(os.path.join(local, "manifest.json")) as f:
                local_manifest = json.load(f)
            if remote_manifest["datasets"] != local_manifest["datasets"]:
                problems.append(f"{name}: the manifests differ")
            zs, zl = ObjectStore(s3, read_only=True), LocalStore(local, read_only=True)
            n = 0
            for cid, case in sorted(local_manifest["datasets"]["vessels"]["cases"].items()):
                gr = zarr.open_group(zs, path=case["entry"], mode="r")
                gl = zarr.open_group(zl, path=case["entry"], mode="r")
                if sorted(gr.array_keys()) != sorted(gl.array_keys()):
                    problems.append(f"{name} {cid}: arrays {sorted(gr.array_keys())} vs "
                                    f"{sorted(gl.array_keys())}")
                    continue
                if dict(gr.attrs) != dict(gl.attrs):
                    problems.append(f"{name} {cid}: group attributes differ")
                for arr in gl.array_keys():
                    x, y = gr[arr][...], gl[arr][...]
                    if x.shape != y.shape or x.dtype != y.dtype or not np.array_equal(x, y):
                        problems.append(f"{name} {cid}/{arr}: {x.shape} {x.dtype} vs "
                                        f"{y.shape} {y.dtype}, equal values: "
                                        f"{x.shape == y.shape and np.array_equal(x, y)}")
                    n += 1
            print(f"{name}: {n} arrays of {len(local_manifest['datasets']['vessels']['cases'])} "
                  f"entries read over S3 by zarr-python {zarr.__version__}: equal to the local cache")
    for p in problems:
        print("problem:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
