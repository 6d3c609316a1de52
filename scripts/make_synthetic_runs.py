"""Makes N synthetic-but-valid run files from a real one, to time trainscope-post on large studies.

Each copy has the real file's schema: root, /config, /build, /plan and /summary attributes, and
/iterations with every column of the real file, resized to [--ranks, --iterations] (chunked
[64 ranks, 1024 rows]) and filled with the real rank 0 values tiled and jittered by a few
percent; /ranks is rank 0's row repeated with rank numbers. world_size and the summary's counts
follow the new shape. Not for measurements: for timing readers.

  python scripts/make_synthetic_runs.py REAL.h5 OUT_DIR [--files 200] [--ranks 16]
                                        [--iterations 2000]
"""

import argparse
import sys
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "postprocess"))
from trainscope_post import schema  # noqa: E402  (the run-file paths; standard library only)


def copy_attrs(src, dst):
    for k, v in src.attrs.items():
        dst.attrs[k] = v


def make(real: Path, out: Path, ranks: int, iters: int, rng: np.random.Generator):
    with h5py.File(real, "r") as s, h5py.File(out, "w") as d:
        copy_attrs(s, d)
        d.attrs["world_size"] = np.int64(ranks)
        for g in (schema.CONFIG, schema.BUILD, schema.PLAN, schema.SUMMARY):
            if g in s:
                copy_attrs(s[g], d.create_group(g))
        if schema.CONFIG_INI in s:
            s.copy(s[schema.CONFIG_INI], d, schema.CONFIG_INI)
        if schema.SUMMARY in d:
            summary = d[schema.SUMMARY].attrs
            warm = int(summary.get("warmup_iterations", 0))
            summary["total_iterations"] = np.int64(iters)
            summary["measured_iterations"] = np.int64(iters - warm)
        if schema.RANKS in s:
            row = s[schema.RANKS][0]
            table = np.repeat(row[None], ranks)
            for name in ("rank", "local_rank"):
                if name in table.dtype.names:
                    table[name] = np.arange(ranks)
            d.create_dataset(schema.RANKS, data=table)
            copy_attrs(s[schema.RANKS], d[schema.RANKS])
        si = s[schema.ITERATIONS]
        di = d.create_group(schema.ITERATIONS)
        copy_attrs(si, di)
        if "rank_rows" in di.attrs:  # the attribute of files before issue 39
            del di.attrs["rank_rows"]
        di.attrs["rows"] = np.int64(iters)
        rr = di.create_dataset("rank_rows", data=np.full(ranks, iters, dtype=np.int64))
        rr.attrs["units"] = "1"
        real_rows = si["rank_rows"][...] if "rank_rows" in si else si.attrs["rank_rows"]
        n_real = int(real_rows[0])
        for name, ds in si.items():
            if name == "rank_rows":
                continue
            base = np.asarray(ds[0, :n_real], dtype=np.float64)
            if name == "iteration":
                data = np.tile(np.arange(iters, dtype=np.float64), (ranks, 1))
            else:
                tiled = np.resize(base, iters)
                data = tiled[None, :] * (1 + 0.03 * rng.standard_normal((ranks, iters)))
            out_ds = di.create_dataset(name, data=data, chunks=(min(ranks, 64), min(1024, iters)),
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
