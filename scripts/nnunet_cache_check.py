#!/usr/bin/env python3
"""A cache built from nnU-Net's plans against nnU-Net's own preprocessed arrays.

    PYTHON=/path/to/venv/bin/python   # nnunetv2 2.8.1, nibabel and the voxcache wheel installed
    $PYTHON scripts/nnunet_cache_check.py --work /tmp/nncache --bin target/release

1. data        two small raw datasets in nnU-Net's layout (the generators of
               scripts/nnunet_fixtures_driver.py): Dataset991 CT-like (anisotropic, about
               0.8 x 0.8 x 3 mm: nnU-Net resamples z apart, CTNormalization), some cases with
               a zero border (cropped); Dataset992 two MR-like channels with a zero background
               (ZScore inside the nonzero mask) and a label voxel at a corner of the crop box
               where every channel is 0 (nnU-Net's normalization mask takes it in), at spacings around 1 mm.
2. nnU-Net     nnUNetv2_plan_and_preprocess -c 3d_fullres (one process).
3. ours        prep build-cache DATA --nnunet-plans nnUNetPlans.json --configuration 3d_fullres.
   With --fixture DIR: the raw datasets, their nnUNetPlans.json and nnU-Net's arrays
   (DIR/<dataset>/expected/<case>.npz: data float32 (c, z, y, x), seg int8 (z, y, x) with its
   -1) are written there, for tests/suite/nnunet_cache.rs.
4. compare     every case: shapes equal; data within 1e-4 of the channel's largest magnitude
               (the acceptance bound); segmentation equal voxel for voxel once nnU-Net's -1
               (background outside the nonzero mask, turned into 0 by its training transforms)
               is read as 0. Prints the worst figures; exit 1 when a bound fails.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

DATASETS = {
    991: dict(name="Dataset991_CacheCT", kind="ct", n=6),
    992: dict(name="Dataset992_CacheMR", kind="regions", n=6),
}


def make_data(work: Path, n: int) -> None:
    import numpy as np
    from nnunet_fixtures_driver import CHANNELS, KINDS, LABELS, PREFIX, make_case
    from nnunet_import_driver import _dump, _save

    for ds_id, d in DATASETS.items():
        kind, name = d["kind"], d["name"]
        rng = np.random.RandomState(ds_id)
        raw = work / "nnUNet_raw" / name
        for sub in ("imagesTr", "labelsTr"):
            (raw / sub).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            sp, shape = KINDS[kind]["spacing"](rng), KINDS[kind]["shape"](rng)
            border = (2, 3, 1) if i % 2 == 1 else (0, 0, 0)
            chans, lab = make_case(kind, shape, sp, rng, zero_border=border)
            if kind == "regions" and i == 0:
                # Labelled where every channel is 0, inside the crop box (its corner):
                # nnU-Net's normalization mask (seg >= 0) takes it in.
                nz = np.any([c != 0 for c in chans], axis=0)
                corner = tuple(np.argwhere(nz).min(axis=0))
                assert not nz[corner]
                lab[corner] = 1
            cid = f"{PREFIX[kind]}_{i:03d}"
            for c, ch in enumerate(chans):
                _save(ch, sp, str(raw / "imagesTr" / f"{cid}_{c:04d}.nii.gz"))
            _save(lab, sp, str(raw / "labelsTr" / f"{cid}.nii.gz"))
        dj = {"channel_names": CHANNELS[kind], "labels": LABELS[kind], "numTraining": n,
              "file_ending": ".nii.gz", "name": name}
        if kind == "regions":
            dj["regions_class_order"] = [1, 2, 3]
        _dump(dj, str(raw / "dataset.json"))


def env_for(work: Path) -> dict:
    env = dict(os.environ)
    env.update({
        "nnUNet_raw": str(work / "nnUNet_raw"),
        "nnUNet_preprocessed": str(work / "nnUNet_preprocessed"),
        "nnUNet_results": str(work / "nnUNet_results"),
        "nnUNet_def_n_proc": "1",
        "OMP_NUM_THREADS": "1",
    })
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--bin", type=Path, default=Path("target/release"))
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--cases", type=int, default=6, help="training cases per dataset")
    ap.add_argument("--fixture", type=Path, help="write the test fixture here")
    a = ap.parse_args()
    import numpy as np
    import voxcache

    work = a.work.resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    make_data(work, a.cases)
    ids = [str(i) for i in DATASETS]
    nn_bin = Path(sys.executable).parent
    subprocess.run([str(nn_bin / "nnUNetv2_plan_and_preprocess"), "-d", *ids, "-c", "3d_fullres",
                    "-np", "1", "-npfp", "1"], env=env_for(work), check=True,
                   stdout=subprocess.DEVNULL)
    from nnunetv2.training.dataloading.nnunet_dataset import infer_dataset_class

    failures = []
    summary = {}
    for ds_id, d in DATASETS.items():
        pre = work / "nnUNet_preprocessed" / d["name"]
        plans = pre / "nnUNetPlans.json"
        cache = work / f"cache_{ds_id}"
        subprocess.run([str(a.bin / "prep"), "build-cache", str(work / "nnUNet_raw" / d["name"]),
                        "--cache-dir", str(cache), "--nnunet-plans", str(plans),
                        "--configuration", "3d_fullres", "-q"], check=True)
        folder = pre / "nnUNetPlans_3d_fullres"
        ds = infer_dataset_class(str(folder))(str(folder))
        ours = voxcache.open(str(cache))
        worst_rel, seg_diff, voxels = 0.0, 0, 0
        if a.fixture:
            out = a.fixture / d["name"]
            if out.exists():
                shutil.rmtree(out)
            shutil.copytree(work / "nnUNet_raw" / d["name"], out)
            shutil.copy(plans, out / "nnUNetPlans.json")
            (out / "expected").mkdir()
        for cid in sorted(ds.identifiers):
            data, seg, _, props = ds.load_case(cid)
            data, seg = np.asarray(data), np.asarray(seg)[0]
            if a.fixture:
                np.savez_compressed(a.fixture / d["name"] / "expected" / f"{cid}.npz",
                                    data=data.astype(np.float32), seg=seg.astype(np.int8))
            case = ours[cid]
            img = case.image[...]
            lab = case.label[...].astype(np.int32)
            if img.shape != data.shape:
                failures.append(f"{d['name']} {cid}: shape {img.shape} != nnU-Net's {data.shape}")
                continue
            for c in range(data.shape[0]):
                scale = max(float(np.abs(data[c]).max()), 1e-12)
                rel = float(np.abs(img[c] - data[c]).max()) / scale
                worst_rel = max(worst_rel, rel)
            ref = np.where(seg < 0, 0, seg).astype(np.int32)
            seg_diff += int((lab != ref).sum())
            voxels += ref.size
        summary[d["name"]] = {"cases": len(ds.identifiers), "worst_relative_difference": worst_rel,
                              "label_voxels_different": seg_diff, "label_voxels": voxels}
        print(f"{d['name']}: {len(ds.identifiers)} cases, data worst |ours - nnU-Net| / max|nnU-Net| "
              f"{worst_rel:.2e}, label voxels different {seg_diff} of {voxels}")
        if worst_rel > a.tolerance:
            failures.append(f"{d['name']}: data differ by {worst_rel:.2e} relative (bound {a.tolerance})")
        if seg_diff:
            failures.append(f"{d['name']}: {seg_diff} label voxels differ")
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
