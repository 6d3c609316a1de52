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
    """The run file opened (or taken up again from study.Run's open handle) last: named in the
    CLI's message when a table fails on it."""
    return _LAST_OPENED[-1] if _LAST_OPENED else None


def reading(path: Path) -> None:
    """Records `path` as the run file being read now (last_opened)."""
    _LAST_OPENED[:] = [Path(path)]


# Names inside a per-rank series group that are not columns (docs/run_file_schema.md, issue 39
# point 1): the rows-per-rank index, the MPI rank of each row, and the group of the aggregates
# over all ranks (/iterations and /epochs only).
RANK_ROWS = "rank_rows"
DETAIL_RANKS = "ranks"
AGGREGATE = "aggregate"
NOT_COLUMNS = frozenset({RANK_ROWS, DETAIL_RANKS, AGGREGATE})
# The fields of an aggregate compound dataset <group>/aggregate/<column> [n].
AGGREGATE_FIELDS = ("min", "mean", "max", "argmax", "count", "slowest")
# The key column whose per-row argmax names the slowest rank, when the file does not say.
SLOWEST_BY = {schema.normalize(schema.ITERATIONS): "step_s",
              schema.normalize(schema.EPOCHS): "epoch_s"}


def _detail_ranks(g) -> np.ndarray | None:
    """A series group's `ranks` dataset (the MPI rank of each row; issue 39 point 1), None in
    files written before it (then row r is rank r)."""
    ds = g.get(DETAIL_RANKS) if isinstance(g, h5py.Group) else None
    if isinstance(ds, h5py.Dataset) and ds.ndim == 1:
        return np.asarray(ds[...])
    return None


def _aggregate_group(g):
    """A series group's `aggregate` subgroup, None without one (older files, or a group the
    writer does not aggregate)."""
    a = g.get(AGGREGATE) if isinstance(g, h5py.Group) else None
    return a if isinstance(a, h5py.Group) else None


def _rank_rows(g) -> np.ndarray | None:
    """A series group's rows per rank: the int64 dataset `rank_rows` (issue 39: an attribute of
    world_size elements outgrows HDF5's object-header limit at 8,184 ranks), else the attribute
    older files carry; None when neither exists."""
    ds = g.get(RANK_ROWS) if isinstance(g, h5py.Group) else None
    if isinstance(ds, h5py.Dataset) and ds.ndim == 1:
        return np.asarray(ds[...])
    if RANK_ROWS in g.attrs:
        return np.asarray(g.attrs[RANK_ROWS])
    return None


def reduce_over_ranks(values: np.ndarray, ranks: np.ndarray, field: str,
                      key: np.ndarray | None = None) -> np.ndarray:
    """The aggregate field `field` per column of per-rank rows `values` [R, n] whose row j is
    MPI rank ranks[j], as the writer computes <group>/aggregate (NaN and infinities are missing
    values): min/mean/max (NaN where no rank has a value), argmax (the MPI rank, -1 where none),
    count, slowest (the value on the argmax of `key` [R, n], default `values`)."""
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[1] if values.ndim == 2 else 0
    ok = np.isfinite(values)
    count = ok.sum(axis=0).astype(np.int64)
    if field == "count":
        return count
    if field in ("argmax", "slowest"):
        k = values if key is None else np.asarray(key, dtype=np.float64)
        kok = np.isfinite(k)
        j = np.argmax(np.where(kok, k, -np.inf), axis=0) if k.shape[0] else np.zeros(n, int)
        has = kok.any(axis=0) if k.shape[0] else np.zeros(n, bool)
        if field == "argmax":
            return np.where(has, np.asarray(ranks, dtype=np.int64)[j] if len(ranks) else -1,
                            -1).astype(np.int64)
        picked = values[j, np.arange(n)] if values.shape[0] else np.full(n, math.nan)
        return np.where(has & np.isfinite(picked), picked, math.nan)
    if field == "mean":
        total = np.where(ok, values, 0.0).sum(axis=0)
        return np.where(count > 0, total / np.maximum(count, 1), math.nan)
    if field in ("min", "max"):
        fill = np.inf if field == "min" else -np.inf
        red = (np.min if field == "min" else np.max)(np.where(ok, values, fill), axis=0) \
            if values.shape[0] else np.full(n, fill)
        return np.where(count > 0, red, math.nan)
    raise KeyError(f"aggregate field {field!r}: one of {', '.join(AGGREGATE_FIELDS)}")


class RunFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        reading(self.path)
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

    # The /summary attributes the schema declares as text (the straggler list, the MFU peak's
    # basis, a warning); every other one must be a number.
    TEXT_SUMMARY = frozenset(k for k, t in schema.ATTRIBUTES[schema.SUMMARY].items() if t == "str")

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
        # /ranks has a row per rank whatever output.per_rank is: with series of a subset of
        # ranks, it is what ties world_size to the file.
        table = self._h5.get(schema.RANKS)
        if isinstance(table, h5py.Dataset) and (table.ndim != 1 or table.shape[0] != world):
            raise bad(f"{schema.RANKS} has shape {table.shape}, expected [world_size={world}] "
                      "rows")
        if schema.SUMMARY in self._h5:
            if not isinstance(self._h5[schema.SUMMARY], h5py.Group):
                raise bad(f"{schema.SUMMARY} is not a group")
            for k, v in self._h5[schema.SUMMARY].attrs.items():
                if k in self.TEXT_SUMMARY:
                    continue
                if isinstance(v, (str, bytes, bool, np.bool_)) or np.ndim(v) != 0 or \
                        not np.issubdtype(np.asarray(v).dtype, np.number):
                    raise bad(f"{schema.SUMMARY}@{k} = {v!r}, expected a number")
        for group in (schema.ITERATIONS, schema.EPOCHS, schema.COMM_BUCKETS, schema.TELEMETRY):
            if group not in self._h5:
                continue
            g = self._h5[group]
            if not isinstance(g, h5py.Group):
                raise bad(f"{group} is a dataset, expected a group of [ranks, rows] series")
            rows_of = self._validate_ranks(g, group, world, bad)
            if group not in (schema.ITERATIONS, schema.EPOCHS):
                continue  # /comm/buckets holds the vector `bytes`; telemetry is checked by use
            width = None
            for name, ds in g.items():
                if not isinstance(ds, h5py.Dataset) or name in NOT_COLUMNS:
                    continue
                if ds.ndim != 2 or ds.shape[0] != rows_of or \
                        not np.issubdtype(ds.dtype, np.number):
                    expected = f"world_size={world}" if rows_of == world and \
                        _detail_ranks(g) is None else f"len({group}/ranks)={rows_of}"
                    raise bad(f"{schema.child(group, name)} has shape {ds.shape} and dtype "
                              f"{ds.dtype}, expected numbers of shape [{expected}, rows]")
                width = ds.shape[1] if width is None else min(width, ds.shape[1])
            rr = _rank_rows(g)
            if rr is not None:
                if rr.ndim != 1 or rr.shape[0] != rows_of or \
                        not np.issubdtype(rr.dtype, np.integer) or (rr < 0).any() or \
                        (width is not None and (rr > width).any()):
                    shown = rr.tolist() if rr.size <= 16 else \
                        f"{rr.size} values in [{rr.min()}, {rr.max()}]"
                    where = f"{group}/rank_rows" if RANK_ROWS in g else f"{group}@rank_rows"
                    raise bad(f"{where} = {shown!r}, expected {rows_of} "
                              f"integers in [0, {width if width is not None else 'rows'}]")
            self._validate_aggregate(g, group, bad)

    @staticmethod
    def _validate_ranks(g, group: str, world: int, bad) -> int:
        """The rows of series `group`: len(<group>/ranks), whose values must be MPI ranks in
        [0, world_size), strictly ascending; world_size in files without the dataset."""
        if DETAIL_RANKS not in g:
            rr = _rank_rows(g)
            if rr is not None and group not in (schema.ITERATIONS, schema.EPOCHS) and \
                    (rr.ndim != 1 or rr.shape[0] != world):
                raise bad(f"{group}/rank_rows has {rr.size} values without {group}/ranks, "
                          f"expected world_size={world}")
            return world
        ranks = _detail_ranks(g)
        where = f"{group}/ranks"
        if ranks is None or not np.issubdtype(ranks.dtype, np.integer):
            ds = g[DETAIL_RANKS]
            what = f"shape {ds.shape} and dtype {ds.dtype}" if isinstance(ds, h5py.Dataset) \
                else "a group"
            raise bad(f"{where} is {what}, expected a 1-D integer dataset of MPI ranks")
        if ranks.size > world or (ranks.size and (ranks.min() < 0 or ranks.max() >= world)) or \
                (ranks.size > 1 and not (np.diff(ranks) > 0).all()):
            shown = ranks.tolist() if ranks.size <= 16 else \
                f"{ranks.size} values in [{ranks.min()}, {ranks.max()}]"
            raise bad(f"{where} = {shown!r}, expected strictly ascending ranks in "
                      f"[0, world_size={world})")
        rr = _rank_rows(g)
        if rr is not None and group not in (schema.ITERATIONS, schema.EPOCHS) and \
                (rr.ndim != 1 or rr.shape[0] != ranks.size):
            raise bad(f"{group}/rank_rows has {rr.size} values, expected len({where}) = "
                      f"{ranks.size}")
        return int(ranks.size)

    @staticmethod
    def _validate_aggregate(g, group: str, bad) -> None:
        """<group>/aggregate/<column>: 1-D compound datasets with at least the fields min, mean,
        max, argmax and count; `rows` (when present) a count within their length."""
        a = g.get(AGGREGATE)
        if a is None:
            return
        if not isinstance(a, h5py.Group):
            raise bad(f"{group}/aggregate is a dataset, expected a group of compound datasets")
        need = {"min", "mean", "max", "argmax", "count"}
        for name, ds in a.items():
            fields = set(ds.dtype.names or ()) if isinstance(ds, h5py.Dataset) else set()
            if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or not need <= fields:
                what = f"shape {ds.shape}, fields {sorted(fields)}" \
                    if isinstance(ds, h5py.Dataset) else "a group"
                raise bad(f"{group}/aggregate/{name} has {what}, expected a 1-D compound dataset "
                          f"with fields {', '.join(AGGREGATE_FIELDS)}")
        rows = a.attrs.get("rows")
        if rows is not None and (np.ndim(rows) != 0 or
                                 not np.issubdtype(np.asarray(rows).dtype, np.integer) or
                                 int(rows) < 0):
            raise bad(f"{group}/aggregate@rows = {rows!r}, expected a row count")

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
        """The datasets of `group`: a series' columns (its rank_rows and ranks indexes left out;
        the aggregate subgroup is no dataset)."""
        g = self._h5.get(group)
        return [k for k, v in g.items() if isinstance(v, h5py.Dataset) and
                not (k in NOT_COLUMNS and v.ndim == 1)] if g is not None else []

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

    # --- per-rank series: detail rows and aggregates (issue 39 point 1) -------------------------
    # A series group holds R rows per column, one per *detail rank*: every rank in files written
    # before issue 39 and in output.per_rank=all, a subset (every K-th rank, one per node, none)
    # otherwise; <group>/ranks names the MPI rank of each row. /iterations and /epochs also hold
    # <group>/aggregate/<column>: per row, min/mean/max/argmax/count/slowest over ALL ranks.
    # Statistics across ranks come from over_ranks(), which reads the aggregates when the file
    # has them and reduces the detail rows (then every rank) otherwise.

    def detail_ranks(self, group: str = schema.ITERATIONS) -> np.ndarray:
        """The MPI rank of each row of series `group`, int64 [R]: <group>/ranks, or in files
        written before it (and a group the file lacks) every rank 0 .. world_size-1."""
        g = self._h5.get(group)
        ranks = _detail_ranks(g) if g is not None else None
        if ranks is None:
            return np.arange(self.world_size, dtype=np.int64)
        return np.asarray(ranks, dtype=np.int64)

    def per_rank_mode(self) -> str:
        """The root attribute per_rank (output.per_rank as given: auto, all, none, node,
        every:K); "all" for files written before it (every rank has its row)."""
        return str(self.attrs(schema.ROOT).get("per_rank", "all"))

    def rank_rows(self, group: str = schema.ITERATIONS) -> np.ndarray:
        """Rows each detail rank (detail_ranks) wrote into series `group`, int64 [R]: the
        dataset <group>/rank_rows, or the attribute of the same name in files written before
        issue 39; zeros when the file has neither."""
        g = self._h5.get(group)
        rr = _rank_rows(g) if g is not None else None
        if rr is None:
            return np.zeros(len(self.detail_ranks(group)), dtype=np.int64)
        return np.asarray(rr, dtype=np.int64)

    def _column_group(self, name: str, group: str):
        """The h5py group of series `group` when it holds column `name`, else None (a file
        without it: older, or a run that does not write it); KeyError when `name` is not a
        column of `group` in the schema either (a misspelt name)."""
        g = self._h5.get(group)
        if name not in NOT_COLUMNS:
            if g is not None and name in g and isinstance(g[name], h5py.Dataset):
                return g
            if schema.is_column(group, name):
                return None
        raise KeyError(f"{self.path}: {name!r} is not a column of {schema.normalize(group)} "
                       f"in the run-file schema {schema.VERSION} (trainscope_post/schema.py)")

    def _measured_window(self, end: int) -> tuple[int, int]:
        """[start, end) of the measured iterations among `end` rows: after the warm-up, at most
        /summary@measured_iterations of them."""
        start = min(self.warmup, end)
        s = self.summary
        if "measured_iterations" in s:
            end = min(end, start + int(s["measured_iterations"]))
        return start, end

    def measured(self, name: str, group: str = schema.ITERATIONS) -> np.ndarray:
        """Column `name` over the measured iterations, [R, n]: one row per detail rank (row j is
        MPI rank detail_ranks(group)[j]; every rank in files without <group>/ranks), NaN where a
        rank wrote less; [R, 0] when the file lacks the column. Reads only that slice. For a
        statistic across ranks use over_ranks (the aggregates cover every rank)."""
        g = self._column_group(name, group)
        if g is None:
            return np.empty((len(self.detail_ranks(group)), 0))
        ds = g[name]
        end = ds.shape[1]
        # A file still being written (or of a killed job) grows its extents in steps of the
        # chunk rows: the rows any rank has written end at the largest rank_rows.
        rr = _rank_rows(g)
        if rr is not None and rr.size and not self.completed:
            end = min(end, int(np.max(rr)))
        start, end = self._measured_window(end)
        return np.asarray(ds[:, start:end], dtype=np.float64)

    def recorded(self, name: str, group: str = schema.ITERATIONS) -> np.ndarray:
        """Column `name` over every iteration all detail ranks recorded, warm-up included:
        [R, n] float64 (row j is MPI rank detail_ranks(group)[j]), n = the fewest rows any of
        them wrote (<group>/rank_rows). KeyError naming the file when the column does not exist
        (or is not a column of the schema at all)."""
        g = self._column_group(name, group)
        if g is None:
            raise KeyError(f"{self.path}: no dataset {schema.child(group, name)}")
        ds = g[name]
        n = ds.shape[1]
        rr = _rank_rows(g)
        if rr is not None and rr.size:
            n = min(n, int(np.min(rr)))
        return np.asarray(ds[:, :n], dtype=np.float64)

    def has_aggregate(self, group: str = schema.ITERATIONS) -> bool:
        """The file holds <group>/aggregate (written since issue 39 for /iterations and
        /epochs, whatever output.per_rank is)."""
        g = self._h5.get(group)
        return g is not None and _aggregate_group(g) is not None

    def slowest_by(self, group: str = schema.ITERATIONS) -> str:
        """The key column whose argmax is an aggregate's `slowest` rank (<group>/aggregate@
        slowest_by: step_s for /iterations, epoch_s for /epochs)."""
        g = self._h5.get(group)
        a = _aggregate_group(g) if g is not None else None
        by = _text(a.attrs.get("slowest_by", "")) if a is not None else ""
        return str(by) if by else SLOWEST_BY.get(schema.normalize(group), "")

    def _aggregate_rows(self, a, ds) -> int:
        """Rows of the aggregate dataset `ds` that hold every rank's values: aggregate@rows
        (a file being written may hold fewer than its extent), else its length."""
        n = ds.shape[0]
        rows = a.attrs.get("rows")
        return min(n, int(rows)) if rows is not None else n

    def _aggregate_dataset(self, name: str, group: str):
        g = self._column_group(name, group)  # KeyError for a name that is no column
        a = _aggregate_group(self._h5.get(group)) if self._h5.get(group) is not None else None
        if a is None or name not in a:
            raise KeyError(f"{self.path}: no dataset {schema.child(group, AGGREGATE)}/{name}"
                           + ("" if g is not None else f" (nor {schema.child(group, name)})"))
        return a, a[name]

    @staticmethod
    def _field(values, field: str | None):
        if field is None:
            return values
        if field not in AGGREGATE_FIELDS:
            raise KeyError(f"aggregate field {field!r}: one of {', '.join(AGGREGATE_FIELDS)}")
        v = values[field]
        return np.asarray(v, dtype=np.int64 if field in ("argmax", "count") else np.float64)

    def aggregate(self, name: str, group: str = schema.ITERATIONS,
                  field: str | None = "mean") -> np.ndarray:
        """Column `name`'s aggregate over ALL ranks, every aggregated row (warm-up included,
        as `recorded`): the field `field` [n] (min, mean, max, slowest: float64; argmax, count:
        int64), or with field=None the compound rows. KeyError naming the file when the file has
        no such aggregate (files before issue 39, /comm/buckets, /telemetry)."""
        a, ds = self._aggregate_dataset(name, group)
        n = self._aggregate_rows(a, ds)
        return self._field(ds[:n], field)

    def measured_aggregate(self, name: str, group: str = schema.ITERATIONS,
                           field: str | None = "mean") -> np.ndarray:
        """As `aggregate`, over the measured iterations only (the window of `measured`: the
        warm-up left out, at most /summary@measured_iterations rows)."""
        a, ds = self._aggregate_dataset(name, group)
        start, end = self._measured_window(self._aggregate_rows(a, ds))
        return self._field(ds[start:end], field)

    def over_ranks(self, name: str, group: str = schema.ITERATIONS, field: str = "mean",
                   window: str = "measured") -> np.ndarray:
        """Per row, a statistic of column `name` across ALL ranks (`field`: min, mean, max,
        argmax = the MPI rank holding max (-1 where no rank has a value), count = ranks with a
        finite value, slowest = the value on the rank slowest in the key column): from
        <group>/aggregate when the file has it, otherwise reduced from the per-rank rows (which
        then hold every rank). window: "measured" (as `measured`) or "recorded" (as `recorded`).
        An empty array when the file lacks the column."""
        if window not in ("measured", "recorded"):
            raise ValueError(f"window {window!r}: measured or recorded")
        if field not in AGGREGATE_FIELDS:
            raise KeyError(f"aggregate field {field!r}: one of {', '.join(AGGREGATE_FIELDS)}")
        g = self._h5.get(group)
        a = _aggregate_group(g) if g is not None else None
        if a is not None and name in a:
            return self.measured_aggregate(name, group, field) if window == "measured" else \
                self.aggregate(name, group, field)
        read = self.measured if window == "measured" else self.recorded
        try:
            values = read(name, group)
        except KeyError:
            if self._column_group(name, group) is None:  # a schema column this file lacks
                return np.empty(0, dtype=np.int64 if field in ("argmax", "count") else float)
            raise
        key = None
        if field == "slowest":
            by = self.slowest_by(group)
            key = read(by, group) if by and by != name and self._has_column(by, group) \
                else values
            n = min(key.shape[1], values.shape[1])
            key, values = key[:, :n], values[:, :n]
        return reduce_over_ranks(values, self.detail_ranks(group), field, key)

    def _has_column(self, name: str, group: str) -> bool:
        g = self._h5.get(group)
        return g is not None and name not in NOT_COLUMNS and name in g and \
            isinstance(g[name], h5py.Dataset)

    def has_column(self, name: str, group: str = schema.ITERATIONS) -> bool:
        """The file holds column `name` of `group`: per-rank rows or an aggregate (a file in
        output.per_rank=none has only the latter)."""
        if self._has_column(name, group):
            return True
        g = self._h5.get(group)
        a = _aggregate_group(g) if g is not None else None
        return a is not None and name in a

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
                    # The tool's own cost: its run-file flushes (syncs included), the largest
                    # rank's, against the training wall time (which includes them).
                    "flush_pct": 100.0 * s.get("flush_total_s", nan) / s.get("wall_s", nan)
                    if s.get("wall_s", 0) else nan,
                }
            )
            if row["workload"] == "llm":  # the last measured iteration's mean over ranks
                loss = self.over_ranks("loss")
                row["train_loss"] = float(loss[-1]) if loss.size else nan
        else:  # interrupted or failed: report what was flushed
            row["iters"] = self.iterations_recorded()
        return row

    def iterations_recorded(self, group: str = schema.ITERATIONS) -> int:
        """Rows every rank wrote into `group`: <group>/aggregate@rows where the file has the
        aggregates (they cover all ranks, also those without per-rank rows), else the fewest
        rank_rows of the (then all) ranks; 0 without the group."""
        g = self._h5.get(group)
        a = _aggregate_group(g) if g is not None else None
        if a is not None and "rows" in a.attrs:
            return int(a.attrs["rows"])
        rows = self.rank_rows(group)
        return int(rows.min()) if rows.size else 0
