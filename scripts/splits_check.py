"""Our cross-validation folds (examples/cv_splits.rs) against scikit-learn's KFold, called as
nnU-Net v2 calls it (nnUNetTrainer.do_split: identifiers sorted by numpy, then
generate_crossval_split: KFold(n_splits, shuffle=True, random_state=seed)), on datasets of
different sizes and id spellings.
CI runs it; where nnunetv2 is installed, --nnunet also compares with nnunetv2's own function:

    python scripts/splits_check.py --example target/debug/examples/cv_splits [--nnunet]
"""

import argparse
import json
import random
import subprocess
import sys

import numpy as np
from sklearn.model_selection import KFold


def reference(ids, n_splits, seed):
    keys = np.sort(np.array(ids))
    out = []
    for tr, va in KFold(n_splits=n_splits, shuffle=True, random_state=seed).split(keys):
        out.append({"train": [str(k) for k in keys[tr]], "val": [str(k) for k in keys[va]]})
    return out


def ours(example, ids, n_splits, seed):
    run = subprocess.run([example, str(n_splits), str(seed)], input="\n".join(ids),
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--example", required=True)
    ap.add_argument("--nnunet", action="store_true")
    a = ap.parse_args()
    rng = random.Random(7)
    datasets = [
        [f"vessels_{i:03d}" for i in range(10)],          # the bundled data
        [f"vessels_{i:03d}" for i in range(70)],          # MiniVess
        [f"case_{i}" for i in range(13)],                 # unpadded ids: sorted as text
        [f"BraTS-{rng.randrange(10**5):05d}-{i}" for i in range(1251)],
        ["".join(rng.choice("abcXYZ019_-") for _ in range(rng.randint(1, 12))) + str(i)
         for i in range(5)],                              # the fewest cases 5 folds take
    ]
    checks = 0
    for ids in datasets:
        for n_splits, seed in [(5, 12345), (3, 0), (10, 2 ** 32 - 1)]:
            if len(ids) < n_splits:
                continue
            want = reference(ids, n_splits, seed)
            got = ours(a.example, ids, n_splits, seed)
            if got != want:
                sys.exit(f"{len(ids)} cases, {n_splits} folds, seed {seed}: ours {got[:1]} != KFold's {want[:1]}")
            checks += 1
            if a.nnunet and (n_splits, seed) == (5, 12345):
                from nnunetv2.utilities.crossval_split import generate_crossval_split
                # As nnUNetTrainer.do_split calls it: the identifiers sorted by numpy.
                keys = list(np.sort(list(ids)))
                theirs = generate_crossval_split(keys, seed=seed, n_splits=n_splits)
                theirs = [{"train": [str(k) for k in f["train"]], "val": [str(k) for k in f["val"]]}
                          for f in theirs]
                if got != theirs:
                    sys.exit(f"{len(ids)} cases: ours != nnunetv2's generate_crossval_split")
                checks += 1
    print(f"splits_check: {checks} split sets identical (scikit-learn KFold"
          f"{' and nnunetv2' if a.nnunet else ''})")


if __name__ == "__main__":
    main()
