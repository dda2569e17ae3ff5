"""What DIALS made of an imported series: run by Debian's python3 (where DIALS and dxtbx live),
not the oracle virtualenv. Reads the experiments `dials.import` wrote and prints them as JSON; with
--images, also writes those images' pixels as dxtbx reads them (and its static mask) as .npy.

    /usr/bin/python3 dials_probe.py imported.expt [--images 0,9 --out DIR] [--spots strong.refl]

With --spots, also the spots `dials.find_spots` found: their centroids (x, y, z in pixels and
images, DIALS's convention: pixel i spans [i, i + 1)).
"""
import argparse
import json
import os

import numpy as np
from dxtbx.model.experiment_list import ExperimentListFactory
from dxtbx.imageset import ImageSequence

parser = argparse.ArgumentParser()
parser.add_argument("expt")
parser.add_argument("--images", default="")
parser.add_argument("--out", default=".")
parser.add_argument("--spots", default="")
args = parser.parse_args()

experiments = ExperimentListFactory.from_json_file(args.expt, check_format=True)
imagesets = experiments.imagesets()
out = {"experiments": len(experiments), "imagesets": []}
for iset in imagesets:
    beam, detector = iset.get_beam(), iset.get_detector()
    panel = detector[0]
    one = {
        "kind": "sweep" if isinstance(iset, ImageSequence) else "stills",
        "images": len(iset),
        "path": iset.get_path(0),
        "wavelength": beam.get_wavelength(),
        "distance_mm": panel.get_distance(),
        "pixel_size_mm": list(panel.get_pixel_size()),
        "image_size": list(panel.get_image_size()),
        "beam_centre_px": list(panel.get_beam_centre_px(beam.get_s0())),
        "trusted_range": list(panel.get_trusted_range()),
        "material": panel.get_material(),
        "thickness_mm": panel.get_thickness(),
    }
    scan, gonio = iset.get_scan(), iset.get_goniometer()
    if scan is not None:
        one["image_range"] = list(scan.get_image_range())
        one["oscillation"] = list(scan.get_oscillation())
    if gonio is not None:
        one["rotation_axis"] = list(gonio.get_rotation_axis())
    out["imagesets"].append(one)
if args.images:
    iset = imagesets[0]
    for i in (int(x) for x in args.images.split(",")):
        pixels = iset.get_raw_data(i)[0].as_numpy_array()
        np.save(os.path.join(args.out, f"image_{i}.npy"), pixels)
        mask = iset.get_mask(i)[0].as_numpy_array()
        np.save(os.path.join(args.out, f"mask_{i}.npy"), mask)
if args.spots:
    from dials.array_family import flex

    table = flex.reflection_table.from_file(args.spots)
    out["spots"] = [list(v) for v in table["xyzobs.px.value"]]
print(json.dumps(out))
