"""Makes N synthetic-but-valid run files from a real one, to time trainscope-post on large studies.

Each copy has the real file's schema: root, /config, /build, /plan and /summary attributes, and
/iterations with every column of the real file, resized to [--ranks, --iterations] (chunked
[1, 1024] like the writer) and filled with the real rank 0 values tiled and jittered by a few
percent; /ranks is rank 0's row repeated with rank numbers. world_size and the summary's counts
follow the new shape. Not for measurements: for timing readers.

  python scripts/make_synthetic_runs.py REAL.h5 OUT_DIR [--files 200] [--ranks 16]
                                        [--iterations 2000]
"""

import argparse
from pathlib import Path

import h5py
import numpy as np


def copy_attrs(src, dst):
    for k, v in src.attrs.items():
        dst.attrs[k] = v


def make(real: Path, out: Path, ranks: int, iters: int, rng: np.random.Generator):
    with h5py.File(real, "r") as s, h5py.File(out, "w") as d:
        copy_attrs(s, d)
        d.attrs["world_size"] = np.int64(ranks)
        for g in ("config", "build", "plan", "summary"):
            if g in s:
                grp = d.create_group(g)
                copy_attrs(s[g], grp)
                if g == "config" and "ini" in s[g]:
                    s.copy(s[g]["ini"], grp, "ini")
        if "summary" in d:
            warm = int(d["summary"].attrs.get("warmup_iterations", 0))
            d["summary"].attrs["total_iterations"] = np.int64(iters)
            d["summary"].attrs["measured_iterations"] = np.int64(iters - warm)
        if "ranks" in s:
            row = s["ranks"][0]
            table = np.repeat(row[None], ranks)
            for name in ("rank", "local_rank"):
                if name in table.dtype.names:
                    table[name] = np.arange(ranks)
            d.create_dataset("ranks", data=table)
            copy_attrs(s["ranks"], d["ranks"])
        si = s["iterations"]
        di = d.create_group("iterations")
        copy_attrs(si, di)
        di.attrs["rows"] = np.int64(iters)
        di.attrs["rank_rows"] = np.full(ranks, iters, dtype=np.int64)
        n_real = int(si.attrs["rank_rows"][0])
        for name, ds in si.items():
            base = np.asarray(ds[0, :n_real], dtype=np.float64)
            if name == "iteration":
                data = np.tile(np.arange(iters, dtype=np.float64), (ranks, 1))
            else:
                tiled = np.resize(base, iters)
                data = tiled[None, :] * (1 + 0.03 * rng.standard_normal((ranks, iters)))
            out_ds = di.create_dataset(name, data=data, chunks=(1, min(1024, iters)),
                                       maxshape=(ranks, None), fillvalue=np.nan)
            copy_attrs(ds, out_ds)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("real", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--files", type=int, default=200)
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--iterations", type=int, default=2000)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(a.files):
        make(a.real, a.out / f"run{i:04d}.h5", a.ranks, a.iterations, rng)
    print(f"{a.files} files of {a.ranks} ranks x {a.iterations} iterations in {a.out}")


if __name__ == "__main__":
    main()
