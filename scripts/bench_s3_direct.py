#!/usr/bin/env python3
"""Training patches read straight from S3 with no local tier: what a zarr-python user gets.

Opens every entry of a cache that `prep build-cache` wrote to s3://BUCKET/PREFIX with
zarr-python over obstore (zarr.storage.ObjectStore), the way docs/s3.md shows, and reads
random 32x64x64 image + label patches (every channel) on one thread, as bench_patches reads
them from a local cache. Prints patches/s and the reads zarr issued per patch (each a GET or a
range GET: shard indexes, inner chunks). scripts/bench_s3.sh runs it beside the local tier.

    python3 scripts/bench_s3_direct.py --endpoint http://127.0.0.1:8333 --bucket voxtest \\
        --prefix bench-123 [--patches 200] [--rounds 3]
Credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
"""
import argparse
import json
import os
import random
import statistics
import time

import zarr
from obstore.store import S3Store
from zarr.storage import ObjectStore

PATCH = (32, 64, 64)


class Counted(ObjectStore):
    """zarr's obstore adapter, counting the reads it sends to the server."""

    reads = 0

    async def get(self, key, prototype, byte_range=None):
        Counted.reads += 1
        return await super().get(key, prototype, byte_range)

    async def get_partial_values(self, prototype, key_ranges):
        key_ranges = list(key_ranges)
        Counted.reads += len(key_ranges)
        return await super().get_partial_values(prototype, key_ranges)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--patches", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    s3 = S3Store(a.bucket, prefix=a.prefix, endpoint=a.endpoint,
                 access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                 secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                 region=os.environ.get("AWS_REGION", "us-east-1"),
                 client_options={"allow_http": True})
    manifest = json.loads(bytes(s3.get("manifest.json").bytes()))
    store = Counted(s3, read_only=True)
    cases = []
    for ds in manifest["datasets"].values():
        for case in ds["cases"].values():
            g = zarr.open_group(store, path=case["entry"], mode="r")
            cases.append((g["image"], g["label"]))
    rng = random.Random(a.seed)
    rates, per_patch = [], []
    for _ in range(a.rounds):
        Counted.reads = 0
        t0 = time.perf_counter()
        for _ in range(a.patches):
            image, label = rng.choice(cases)
            shape = label.shape
            lo = [rng.randrange(max(1, s - p + 1)) for s, p in zip(shape, PATCH)]
            box = tuple(slice(o, o + p) for o, p in zip(lo, PATCH))
            image[(slice(None),) + box]
            label[box]
        dt = time.perf_counter() - t0
        rates.append(a.patches / dt)
        per_patch.append(Counted.reads / a.patches)
    print(json.dumps({"tool": f"zarr-python {zarr.__version__} over obstore, no local tier",
                      "patches": a.patches, "rounds": a.rounds,
                      "patches_per_s": statistics.median(rates),
                      "reads_per_patch": statistics.median(per_patch)}))


if __name__ == "__main__":
    main()
