"""`metrics.jsonl` read incrementally into columns, and min/max-preserving downsampling.

A `MetricsLog` remembers how many bytes of the file it has parsed, so refreshing a live run
costs only its new lines. Blocks of complete lines are parsed by pyarrow's JSON reader (C++,
multi-threaded) when pyarrow is installed; a block it refuses (a corrupt or half-written line,
`NaN`, a value too large for its types) is parsed line by line with `json`, and each line that
is not a JSON object with an integer `step` is skipped and counted. A last line without its
newline is being written: it is left for the next refresh (and counted as skipped until it
completes).

A long file is parsed in the background (`Runs.log`); until it is done, requests get a
`preview()`: a few thousand complete lines read at evenly spaced byte offsets plus the file's
tail, marked `partial`, so a run of a million lines opens in well under a second. Its last
values are exact (they come from the tail); its curves are a sample (a spike between two
samples shows only in the exact view that follows) and its line counts are estimates.
"""

from __future__ import annotations

import io
import json
import math
import threading
from collections.abc import Iterable

import numpy as np

try:  # the `dashboard` extra; without it every line is parsed by `json` (several times slower)
    import pyarrow as pa
    import pyarrow.json as pj
except ImportError:
    pa = pj = None

from meltemi.levanter.dashboard._root import RunsRoot

#: Bytes parsed per block (pyarrow) and read per refresh (a live run's new lines are few).
BLOCK_BYTES = 32 << 20
#: A block pyarrow refuses is parsed again in pieces of this size (then line by line).
RETRY_BYTES = 256 << 10
#: A log with more unparsed bytes than this is parsed in the background; requests meanwhile
#: get a `preview()` (one block: parsing it takes a fraction of a second).
PREVIEW_ABOVE_BYTES = BLOCK_BYTES
#: The preview reads this many windows of `PREVIEW_WINDOW_BYTES` (a few lines each) at evenly
#: spaced offsets, then the file's last `PREVIEW_TAIL_BYTES`.
PREVIEW_WINDOWS = 2000
PREVIEW_WINDOW_BYTES = 2048
PREVIEW_TAIL_BYTES = 64 << 10


class MetricsLog:
    """The parsed columns of one `metrics.jsonl`, extended on each `refresh()`.

    Args:
        root: the runs folder the file is read through.
        path: the file's full path (from `root.path`).
    """

    def __init__(self, root: RunsRoot, path: str):
        self.root = root
        self.path = path
        self.lock = threading.Lock()
        #: True for a `preview()`: a sample of the file, not every line.
        self.partial = False
        self._preview: tuple[int, MetricsLog] | None = None
        self._reset()

    def _reset(self) -> None:
        self.offset = 0  # bytes parsed (always just after a newline)
        self.lines = 0  # good lines
        self.corrupt = 0  # complete lines that were skipped
        self.partial_tail = False  # bytes after the last newline
        self.last_step = 0
        self.last: dict[str, float] = {}  # each key's last value
        self._head = b""
        self._columns: dict[str, _Column] = {}

    @property
    def skipped(self) -> int:
        """Corrupt lines, plus the half-written last line if there is one."""
        return self.corrupt + int(self.partial_tail)

    @property
    def keys(self) -> list[str]:
        """Every numeric metric key seen so far (sorted)."""
        return sorted(self._columns)

    def refresh(self) -> bool:
        """Parses the lines appended since the last call; True if there were any."""
        with self.lock:
            stat = self.root.stat(self.path)
            if stat is None:
                if self.offset:
                    self._reset()
                return False
            if stat.size < self.offset or (self.offset and not self._same_head()):
                self._reset()  # rewritten (e.g. a run started over in the same directory)
            if stat.size == self.offset:
                self.partial_tail = False
                return False
            before = self.lines
            while self.offset < stat.size:
                data = self.root.read_bytes(
                    self.path, self.offset, min(stat.size, self.offset + BLOCK_BYTES)
                )
                cut = data.rfind(b"\n") + 1
                if cut == 0:  # no complete line in this block
                    if self.offset + len(data) < stat.size:  # a single line over BLOCK_BYTES
                        end = self.root.read_bytes(self.path, self.offset, stat.size).find(b"\n")
                        if end >= 0:
                            self.corrupt += 1
                            self.offset += end + 1
                            continue
                    self.partial_tail = bool(data.strip())
                    break
                if not self._head:
                    self._head = data[:64]
                self._parse(data[:cut])
                self.offset += cut
                self.partial_tail = False
            return self.lines > before

    def pending_bytes(self) -> int:
        """Bytes of the file not parsed yet (0 if it is gone)."""
        stat = self.root.stat(self.path)
        return max(0, stat.size - self.offset) if stat is not None else 0

    def preview(self) -> MetricsLog:
        """A `partial` log of sampled lines and the file's tail (see the module docstring).

        Cached for the file's current size. Never waits for a parse in progress.
        """
        stat = self.root.stat(self.path)
        size = stat.size if stat is not None else 0
        cached = self._preview
        if cached is not None and cached[0] == size:
            return cached[1]
        out = MetricsLog(self.root, self.path)
        out.partial = True
        tail_start = max(0, size - PREVIEW_TAIL_BYTES)
        stride = tail_start / PREVIEW_WINDOWS
        ranges = []
        if stride > PREVIEW_WINDOW_BYTES:  # else the file is small: read it whole
            for k in range(PREVIEW_WINDOWS):
                start = int(k * stride)
                ranges.append((start, start + PREVIEW_WINDOW_BYTES))
        else:
            tail_start = 0
        ranges.append((tail_start, size))
        lines, sampled_bytes = [], 0
        for (start, _), data in zip(ranges, self.root.read_ranges(self.path, ranges), strict=True):
            first = 0 if start == 0 else data.find(b"\n") + 1  # a window starts mid-line
            last = data.rfind(b"\n") + 1  # ...and ends mid-line (the tail: a half-written one)
            if 0 < first < last or (first == 0 and last):
                lines.append(data[first:last])
                sampled_bytes += last - first
        block = b"".join(lines)
        if block:
            out._parse(block)
        if sampled_bytes:  # estimates: the sample's rate over the whole file
            scale = size / sampled_bytes
            out.lines, out.corrupt = round(out.lines * scale), round(out.corrupt * scale)
        out.offset = size
        self._preview = (size, out)
        return out

    def _same_head(self) -> bool:
        return self.root.read_bytes(self.path, 0, len(self._head)) == self._head

    def _parse(self, block: bytes) -> None:
        if pj is None:
            self._parse_lines(block.splitlines())
            return
        try:
            table = pj.read_json(
                io.BytesIO(block),
                read_options=pj.ReadOptions(block_size=max(1 << 20, len(block) + 1)),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            if len(block) <= RETRY_BYTES:
                self._parse_lines(block.splitlines())
                return
            # One bad line must not send the whole block down the slow path: retry in pieces.
            start = 0
            while start < len(block):
                end = block.rfind(b"\n", start, start + RETRY_BYTES) + 1
                if end <= start:  # one line longer than a piece
                    end = block.find(b"\n", start + RETRY_BYTES) + 1 or len(block)
                self._parse(block[start:end])
                start = end
            return
        if "step" not in table.column_names or not _integer(table.schema.field("step").type):
            self._parse_lines(block.splitlines())
            return
        step_col = table.column("step")
        if step_col.null_count:  # a line without a step: count it, keep the rest
            self._parse_lines(block.splitlines())
            return
        steps = step_col.to_numpy().astype(np.int64)
        for name in table.column_names:
            if name == "step":
                continue
            col = table.column(name)
            if not _numeric(col.type):
                continue
            valid = col.is_valid().to_numpy(zero_copy_only=False)
            values = col.cast(pa.float64()).fill_null(math.nan).to_numpy()
            if not valid.all():
                self._add(name, steps[valid], values[valid])
            else:
                self._add(name, steps, values)
        self.lines += len(steps)
        if len(steps):
            self.last_step = int(steps[-1])
            for name in table.column_names:
                column = self._columns.get(name)
                if column is not None and column.last_step == steps[-1]:
                    self.last[name] = column.last_value

    def _parse_lines(self, lines: Iterable[bytes]) -> None:
        cols: dict[str, tuple[list[int], list[float]]] = {}
        last_step = None
        for raw in lines:
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError:
                self.corrupt += 1
                continue
            step = row.get("step") if isinstance(row, dict) else None
            if not isinstance(step, int) or isinstance(step, bool):
                self.corrupt += 1
                continue
            self.lines += 1
            last_step = step
            for name, value in row.items():
                if name == "step" or not isinstance(value, (int, float)):
                    continue
                s, v = cols.setdefault(name, ([], []))
                s.append(step)
                v.append(float(value))
        for name, (s, v) in cols.items():
            self._add(name, np.asarray(s, np.int64), np.asarray(v, np.float64))
            if s[-1] == last_step:
                self.last[name] = v[-1]
        if last_step is not None:
            self.last_step = last_step

    def _add(self, name: str, steps: np.ndarray, values: np.ndarray) -> None:
        if len(steps):
            self._columns.setdefault(name, _Column()).append(steps, values)

    def series(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one key, in step order; a step logged twice (a resumed run
        re-logging steps after its checkpoint) keeps its last value."""
        with self.lock:
            column = self._columns.get(name)
            if column is None:
                return np.zeros(0, np.int64), np.zeros(0)
            return column.view()


class _Column:
    """One key's (steps, values), in buffers that grow by doubling: appending a live run's
    new lines costs those lines, not a copy of the whole series."""

    def __init__(self):
        self._steps = np.zeros(1024, np.int64)
        self._values = np.zeros(1024, np.float64)
        self.n = 0
        self.in_order = True  # steps strictly increasing

    @property
    def last_step(self) -> int:
        return int(self._steps[self.n - 1])

    @property
    def last_value(self) -> float:
        return float(self._values[self.n - 1])

    def append(self, steps: np.ndarray, values: np.ndarray) -> None:
        k = len(steps)
        if self.n + k > len(self._steps):
            size = max(2 * len(self._steps), self.n + k)
            self._steps = np.resize(self._steps, size)
            self._values = np.resize(self._values, size)
        if self.in_order and (
            (self.n and steps[0] <= self._steps[self.n - 1])
            or (k > 1 and not np.all(steps[1:] > steps[:-1]))
        ):
            self.in_order = False
        self._steps[self.n : self.n + k] = steps
        self._values[self.n : self.n + k] = values
        self.n += k

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.in_order:  # keep each step's last value, in step order (once)
            steps, values = self._steps[: self.n], self._values[: self.n]
            _, first = np.unique(steps[::-1], return_index=True)
            keep = self.n - 1 - first
            self.n = len(keep)
            self._steps[: self.n], self._values[: self.n] = steps[keep], values[keep]
            self.in_order = True
        return self._steps[: self.n], self._values[: self.n]


def _integer(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def downsample(
    steps: np.ndarray, values: np.ndarray, max_points: int
) -> tuple[np.ndarray, np.ndarray]:
    """At most about `max_points` points that keep each bucket's minimum and maximum.

    The series is cut into `max_points // 2` buckets of equal length; each contributes its
    lowest and highest point in step order (a spike survives however long the run), and the
    last point is always kept (a live curve ends at the newest step). Non-finite values are
    kept only when a bucket has nothing else.

    Example:
        >>> s, v = downsample(np.arange(10), np.array([0, 5, 1, 1, 1, 1, 1, 1, -3, 2.0]), 4)
        >>> s.tolist(), v.tolist()
        ([0, 1, 8, 9], [0.0, 5.0, -3.0, 2.0])
    """
    n = len(steps)
    if n <= max_points:
        return steps, values
    buckets = max(1, max_points // 2)
    width = n // buckets
    m = width * buckets
    finite = np.isfinite(values[:m])
    lo = np.where(finite, values[:m], np.inf).reshape(buckets, width)
    hi = np.where(finite, values[:m], -np.inf).reshape(buckets, width)
    base = np.arange(buckets) * width
    pick = np.concatenate([base + lo.argmin(axis=1), base + hi.argmax(axis=1)])
    if m < n:  # the remainder is one more bucket
        tail_v = np.where(np.isfinite(values[m:]), values[m:], np.nan)
        if np.isfinite(tail_v).any():
            pick = np.concatenate([pick, [m + np.nanargmin(tail_v), m + np.nanargmax(tail_v)]])
    pick = np.unique(np.concatenate([pick, [n - 1]]))
    return steps[pick], values[pick]


def json_values(values: np.ndarray) -> list[float | None]:
    """Floats for JSON: NaN and infinities become None (`null`)."""
    out = values.tolist()
    if not np.isfinite(values).all():
        out = [v if math.isfinite(v) else None for v in out]
    return out
