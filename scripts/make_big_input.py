"""Write a .nii.gz that truthfully inflates to a large uint8 volume (default 2048x2048x1024,
4 GiB), a slice at a time, so the generator itself never holds the volume: zeros with a bright
ball in the middle and a faint ramp, as a light-sheet stack with much empty space compresses.

    python scripts/make_big_input.py OUT.nii.gz [--shape X,Y,Z] [--label OUT_LABEL.nii.gz]
"""
import argparse
import gzip

import nibabel as nib
import numpy as np


def header(shape, dtype):
    h = nib.Nifti1Header()
    h.set_data_dtype(dtype)
    h.set_data_shape(shape)
    h.set_zooms((1.0, 1.0, 1.0))
    h.set_xyzt_units("mm")
    h.set_qform(np.diag([1.0, 1.0, 1.0, 1.0]), code=1)
    h.set_sform(np.diag([1.0, 1.0, 1.0, 1.0]), code=1)
    h["vox_offset"] = 352
    return h.binaryblock + b"\0" * 4


def write(path, shape, slice_of):
    x, y, z = shape
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(header(shape, np.uint8))
        for k in range(z):
            # NIfTI stores x fastest: a (y, x) slice in C order.
            f.write(np.ascontiguousarray(slice_of(k), dtype=np.uint8).tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="2048,2048,1024")
    ap.add_argument("--label")
    a = ap.parse_args()
    x, y, z = (int(v) for v in a.shape.split(","))
    yy, xx = np.mgrid[0:y, 0:x]
    r = min(x, y, z) / 4

    def ball(k):
        d2 = (xx - x / 2) ** 2 + (yy - y / 2) ** 2 + (k - z / 2) ** 2
        return d2 < r * r

    write(a.out, (x, y, z), lambda k: np.where(ball(k), 200, (k * 7) % 3))
    if a.label:
        write(a.label, (x, y, z), lambda k: ball(k).astype(np.uint8))


if __name__ == "__main__":
    main()
