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

from . import schema

SCHEMA = schema.VERSION


class SchemaError(ValueError):
    """The file is not a trainscope run file this reader understands."""


class DamagedRunError(SchemaError):
    """A trainscope run file (its schema matches) whose structure or recorded values cannot be
    true: a world size below 1, a series of the wrong shape, negative row counts."""


class IncompleteRunError(ValueError):
    """The run file is valid but its run did not complete (status running, failed, interrupted)."""


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


_LAST_OPENED: list[Path] = []


def last_opened() -> Path | None:
    """The run file opened last (named in the CLI's message when a table fails on it)."""
    return _LAST_OPENED[-1] if _LAST_OPENED else None


def _rank_rows(g) -> np.ndarray | None:
    """A series group's rows per rank: the int64 dataset `rank_rows` (issue 39: an attribute of
    world_size elements outgrows HDF5's object-header limit at 8,184 ranks), else the attribute
    older files carry; None when neither exists."""
    ds = g.get("rank_rows") if isinstance(g, h5py.Group) else None
    if isinstance(ds, h5py.Dataset) and ds.ndim == 1:
        return np.asarray(ds[...])
    if "rank_rows" in g.attrs:
        return np.asarray(g.attrs["rank_rows"])
    return None


class RunFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        _LAST_OPENED[:] = [self.path]
        try:
            self._h5 = h5py.File(self.path, "r")
        except OSError as e:
            raise SchemaError(f"{self.path}: cannot open as HDF5 ({e})") from e
        version = _text(self._h5.attrs.get("schema", b""))
        if version != SCHEMA:
            self._h5.close()
            raise SchemaError(f"{self.path}: schema {version!r}, expected {SCHEMA!r}")
        try:
            self._validate()
        except SchemaError:
            self._h5.close()
            raise
        except Exception as e:  # h5py's own errors on a damaged file
            self._h5.close()
            raise SchemaError(f"{self.path}: unreadable ({type(e).__name__}: {e})") from e

    # The /summary attributes that are text; every other one is a number.
    TEXT_SUMMARY = frozenset({"straggler_ranks"})

    def _validate(self) -> None:
        """The structure every reader relies on (docs/run_file_schema.md), so that a hand-made or
        damaged file is refused here, named, instead of failing deep inside a table."""
        def bad(what):
            return DamagedRunError(f"{self.path}: {what} (docs/run_file_schema.md)")
        root = self._h5.attrs
        ws = root.get("world_size", 1)
        if isinstance(ws, (str, bytes)) or np.ndim(ws) != 0 or not float(ws) >= 1 or \
                not np.isfinite(float(ws)) or float(ws) != int(ws):
            shown = ws.item() if isinstance(ws, np.generic) else ws  # 0, not np.int64(0)
            raise bad(f"attribute world_size = {shown!r}, expected a positive integer")
        world = int(ws)
        for key in ("status", "workload"):
            if key in root and not isinstance(root[key], (str, bytes)):
                raise bad(f"attribute {key} = {root[key]!r}, expected text")
        if schema.SUMMARY in self._h5:
            if not isinstance(self._h5[schema.SUMMARY], h5py.Group):
                raise bad(f"{schema.SUMMARY} is not a group")
            for k, v in self._h5[schema.SUMMARY].attrs.items():
                if k in self.TEXT_SUMMARY:
                    continue
                if isinstance(v, (str, bytes, bool, np.bool_)) or np.ndim(v) != 0 or \
                        not np.issubdtype(np.asarray(v).dtype, np.number):
                    raise bad(f"{schema.SUMMARY}@{k} = {v!r}, expected a number")
        for group in (schema.ITERATIONS, schema.EPOCHS):
            if group not in self._h5:
                continue
            g = self._h5[group]
            if not isinstance(g, h5py.Group):
                raise bad(f"{group} is a dataset, expected a group of [ranks, rows] series")
            width = None
            for name, ds in g.items():
                if not isinstance(ds, h5py.Dataset) or name == "rank_rows":
                    continue
                if ds.ndim != 2 or ds.shape[0] != world or \
                        not np.issubdtype(ds.dtype, np.number):
                    raise bad(f"{schema.child(group, name)} has shape {ds.shape} and dtype "
                              f"{ds.dtype}, expected numbers of shape [world_size={world}, rows]")
                width = ds.shape[1] if width is None else min(width, ds.shape[1])
            rr = _rank_rows(g)
            if rr is not None:
                if rr.ndim != 1 or rr.shape[0] != world or \
                        not np.issubdtype(rr.dtype, np.integer) or (rr < 0).any() or \
                        (width is not None and (rr > width).any()):
                    shown = rr.tolist() if rr.size <= 16 else \
                        f"{rr.size} values in [{rr.min()}, {rr.max()}]"
                    where = f"{group}/rank_rows" if "rank_rows" in g else f"{group}@rank_rows"
                    raise bad(f"{where} = {shown!r}, expected {world} "
                              f"integers in [0, {width if width is not None else 'rows'}]")

    def close(self):
        self._h5.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- attributes ---------------------------------------------------------------------------
    def attrs(self, group: str = schema.ROOT) -> dict:
        if group not in self._h5:
            return {}
        return {k: _text(v) for k, v in self._h5[group].attrs.items()}

    @property
    def status(self) -> str:
        return self.attrs(schema.ROOT).get("status", "unknown")

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    @property
    def config(self) -> dict:
        return self.attrs(schema.CONFIG)

    @property
    def summary(self) -> dict:
        return self.attrs(schema.SUMMARY)

    @property
    def plan(self) -> dict:
        """The run's plan (batch split, parameters, MACs, memory estimate); {} if absent."""
        return self.attrs(schema.PLAN)

    def require_completed(self) -> "RunFile":
        """self, or IncompleteRunError naming the file and its status: for measurements that
        must not be taken from a run that died or was stopped."""
        if not self.completed:
            raise IncompleteRunError(f"{self.path}: status {self.status!r}, not a completed run")
        return self

    # --- series ------------------------------------------------------------------------------
    # Paths may be absolute (schema.ITERATIONS, "/iterations") or relative to the root.
    def series(self, group: str, name: str) -> Series:
        """The dataset `name` of `group` (a series column, a vector, ...) with its units."""
        ds = self._h5[schema.child(group, name)]
        return Series(np.asarray(ds[...]), _text(ds.attrs.get("units", "")))

    def columns(self, group: str) -> list[str]:
        """The datasets of `group`: a series' columns (its rank_rows index left out)."""
        g = self._h5.get(group)
        return [k for k, v in g.items() if isinstance(v, h5py.Dataset) and
                not (k == "rank_rows" and v.ndim == 1)] if g is not None else []

    def ranks(self) -> np.ndarray:
        return np.asarray(self._h5[schema.RANKS][...])

    def has(self, path: str) -> bool:
        return path in self._h5

    def group(self, path: str):
        return self._h5.get(path)

    @property
    def world_size(self) -> int:
        return int(self.attrs(schema.ROOT).get("world_size", 0) or 0)

    @property
    def warmup(self) -> int:
        """Warm-up iterations excluded from statistics: /summary's count, or for a run without a
        summary (interrupted) the configured profile.warmup_iters."""
        s = self.summary
        if "warmup_iterations" in s:
            return int(s["warmup_iterations"])
        try:
            return int(self.config.get("profile.warmup_iters", 0))
        except (TypeError, ValueError):
            return 0

    def rank_rows(self, group: str = schema.ITERATIONS) -> np.ndarray:
        """Rows each rank wrote into series `group`: the dataset <group>/rank_rows, or the
        attribute of the same name in files written before issue 39."""
        g = self._h5.get(group)
        rr = _rank_rows(g) if g is not None else None
        if rr is None:
            return np.zeros(self.world_size, dtype=np.int64)
        return np.asarray(rr, dtype=np.int64)

    def _column_group(self, name: str, group: str):
        """The h5py group of series `group` when it holds column `name`, else None (a file
        without it: older, or a run that does not write it); KeyError when `name` is not a
        column of `group` in the schema either (a misspelt name)."""
        g = self._h5.get(group)
        if g is not None and name in g:
            return g
        if not schema.is_column(group, name):
            raise KeyError(f"{self.path}: {name!r} is not a column of {schema.normalize(group)} "
                           f"in the run-file schema {schema.VERSION} (trainscope_post/schema.py)")
        return None

    def measured(self, name: str, group: str = schema.ITERATIONS) -> np.ndarray:
        """Column `name` over the measured iterations, [ranks, n] (NaN where a rank wrote less);
        [ranks, 0] when the file lacks the column. Reads only that slice of the dataset."""
        g = self._column_group(name, group)
        if g is None:
            return np.empty((self.world_size, 0))
        ds = g[name]
        end = ds.shape[1]
        # A file still being written (or of a killed job) grows its extents in steps of the
        # chunk rows: the rows any rank has written end at the largest rank_rows.
        rr = _rank_rows(g)
        if rr is not None and rr.size and not self.completed:
            end = min(end, int(np.max(rr)))
        start = min(self.warmup, end)
        s = self.summary
        if "measured_iterations" in s:
            end = min(end, start + int(s["measured_iterations"]))
        return np.asarray(ds[:, start:end], dtype=np.float64)

    def recorded(self, name: str, group: str = schema.ITERATIONS) -> np.ndarray:
        """Column `name` over every iteration all ranks recorded, warm-up included: [ranks, n]
        float64, n = the fewest rows any rank wrote (/iterations/rank_rows). KeyError naming the
        file when the column does not exist (or is not a column of the schema at all)."""
        g = self._column_group(name, group)
        if g is None:
            raise KeyError(f"{self.path}: no dataset {schema.child(group, name)}")
        ds = g[name]
        n = ds.shape[1]
        rr = _rank_rows(g)
        if rr is not None and rr.size:
            n = min(n, int(np.min(rr)))
        return np.asarray(ds[:, :n], dtype=np.float64)

    def ragged(self, path: str, rank: int) -> np.ndarray:
        """Rank `rank`'s values of a variable-length per-rank table column (e.g.
        /profile/top_ops/self_s): path[path_offset[rank] : + path_count[rank]]. KeyError naming
        the file when the column does not exist."""
        if path not in self._h5:
            raise KeyError(f"{self.path}: no dataset {path}")
        off = int(self._h5[f"{path}_offset"][rank])
        cnt = int(self._h5[f"{path}_count"][rank])
        values = self._h5[path][off:off + cnt]
        return np.array([_text(v) for v in values]) if values.dtype.kind in "OS" else \
            np.asarray(values, dtype=np.float64)

    def units(self, name: str, group: str = schema.ITERATIONS) -> str:
        """The `units` attribute of column `name`, "" when the file lacks the column."""
        g = self._column_group(name, group)
        if g is None:
            return ""
        return str(_text(g[name].attrs.get("units", "")))

    @property
    def method(self) -> str:
        """LLM method (full, lora, ...) or empty for other workloads."""
        if self.attrs(schema.ROOT).get("workload") != "llm":
            return ""
        return self.attrs(schema.PLAN).get("method", self.config.get("llm.method", ""))

    @property
    def dataset(self) -> str:
        if self.attrs(schema.ROOT).get("workload") == "llm":
            return self.attrs(schema.PLAN).get("dataset_format",
                                               self.config.get("llm.dataset.format", ""))
        return self.config.get("data.dataset", "")

    # --- one row for tables ------------------------------------------------------------------
    def summary_row(self) -> dict:
        """One row for the summary table, from attributes only (no per-iteration data) for a
        completed run; an incomplete run's iteration count comes from /iterations/rank_rows."""
        root, cfg, s = self.attrs(schema.ROOT), self.config, self.summary
        row = {
            "file": str(self.path),
            "workload": root.get("workload", ""),
            "strategy": cfg.get("run.strategy", ""),
            "precision": cfg.get("run.precision", ""),
            "ranks": root.get("world_size", ""),
            "nodes": root.get("num_nodes", ""),
            "dataset": self.dataset,
            "method": self.method,
            "status": self.status,
        }
        nan = math.nan
        if s:
            tokens_per_s = s.get("throughput_tokens_per_s", nan)
            peaks = [s.get(k, nan) for k in ("peak_device_allocated_bytes", "peak_host_tensor_bytes")]
            peak = next((p for p in peaks if p == p), nan)  # device first, else host tensors
            row.update(
                {
                    "iters": s.get("measured_iterations", ""),
                    "median_step_s": s.get("median_step_s", nan),
                    "samples_per_s": s.get("throughput_samples_per_s", nan),
                    "tokens_per_s": tokens_per_s,
                    "val_accuracy": s.get("final_val_accuracy", nan),
                    "train_loss": s.get("final_train_loss", nan),
                    "peak_mem_MiB": peak / 2**20,
                    "peak_rss_MiB": s.get("peak_host_rss_bytes", nan) / 2**20,
                    "energy_per_sample_j": s.get("energy_per_sample_j", nan),
                    "wall_s": s.get("wall_s", nan),
                }
            )
            if row["workload"] == "llm":
                loss = self.measured("loss")
                row["train_loss"] = float(np.nanmean(loss[:, -1])) if loss.size else nan
        else:  # interrupted or failed: report what was flushed
            rows = self.rank_rows()
            row["iters"] = int(rows.min()) if rows.size else 0
        return row
