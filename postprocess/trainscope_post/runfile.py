"""Reader for one trainscope run file (HDF5, schema ``trainscope/1``; see docs/run_file_schema.md).

A run is finished only when the root attribute ``status`` is ``completed``; a file whose status is
still ``running`` comes from a job that died or is still going, and holds the rows up to its last
collective flush.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

SCHEMA = "trainscope/1"


class SchemaError(ValueError):
    """The file is not a trainscope run file this reader understands."""


def _text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _text(value[()])
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass
class Series:
    """A per-rank series: ``values[rank, i]`` with its units."""

    values: np.ndarray
    units: str


class RunFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._h5 = h5py.File(self.path, "r")
        except OSError as e:
            raise SchemaError(f"{self.path}: cannot open as HDF5 ({e})") from e
        schema = _text(self._h5.attrs.get("schema", b""))
        if schema != SCHEMA:
            self._h5.close()
            raise SchemaError(f"{self.path}: schema {schema!r}, expected {SCHEMA!r}")

    def close(self):
        self._h5.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- attributes ---------------------------------------------------------------------------
    def attrs(self, group: str = "/") -> dict:
        if group not in self._h5:
            return {}
        return {k: _text(v) for k, v in self._h5[group].attrs.items()}

    @property
    def status(self) -> str:
        return self.attrs("/").get("status", "unknown")

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    @property
    def config(self) -> dict:
        return self.attrs("/config")

    @property
    def summary(self) -> dict:
        return self.attrs("/summary")

    # --- series ------------------------------------------------------------------------------
    def series(self, group: str, name: str) -> Series:
        ds = self._h5[f"{group}/{name}"]
        return Series(np.asarray(ds[...]), _text(ds.attrs.get("units", "")))

    def columns(self, group: str) -> list[str]:
        g = self._h5.get(group)
        return [k for k, v in g.items() if isinstance(v, h5py.Dataset)] if g is not None else []

    def ranks(self) -> np.ndarray:
        return np.asarray(self._h5["ranks"][...])

    # --- one row for tables ------------------------------------------------------------------
    def summary_row(self) -> dict:
        root, cfg, s = self.attrs("/"), self.config, self.summary
        row = {
            "file": self.path.name,
            "workload": root.get("workload", ""),
            "strategy": cfg.get("run.strategy", ""),
            "precision": cfg.get("run.precision", ""),
            "ranks": root.get("world_size", ""),
            "nodes": root.get("num_nodes", ""),
            "dataset": cfg.get("data.dataset", ""),
            "status": self.status,
        }
        if s:
            row.update(
                {
                    "iters": s.get("measured_iterations", ""),
                    "median_step_s": s.get("median_step_s", math.nan),
                    "samples_per_s": s.get("throughput_samples_per_s", math.nan),
                    "val_accuracy": s.get("final_val_accuracy", math.nan),
                    "train_loss": s.get("final_train_loss", math.nan),
                    "peak_rss_MiB": s.get("peak_host_rss_bytes", math.nan) / 2**20,
                    "wall_s": s.get("wall_s", math.nan),
                }
            )
        else:  # interrupted: report what was flushed
            if "iterations" in self._h5 and "step_s" in self._h5["iterations"]:
                steps = self.series("iterations", "step_s").values
                row["iters"] = int(np.sum(~np.isnan(steps[0]))) if steps.size else 0
        return row
