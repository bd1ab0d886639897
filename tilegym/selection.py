"""Selection by measured speed: per-arch dispatch tables generated from committed benchmark JSON.

A table (``tilegym/selection_tables/<arch>.json``) maps the *regime* of a call (its bucketed
selection features) to the backends measured in that regime, fastest first. ``auto`` tries
them in that order, then the remaining backends of the vendor priority list. Without a table
for the device's arch, or without a row for the regime, ``auto`` uses the vendor priority list.

Relaxation: a regime whose layout ("paged", "ragged") was never measured uses the row of the
same regime with layout "dense", and says so; nothing else is relaxed (no neighbouring
buckets, no other kv dtype), since a ranking measured elsewhere can be wrong.

Score of a backend in a regime: the geometric mean, over the regime's measured shapes where
it ran, of its time divided by the fastest backend's time in that shape (1.0 = fastest in
every shape). Tables are never typed by hand: ``main`` builds them (``build_table``).

Nothing here reads a file or queries a device at import; tables load on first use.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.resources
import json
import math
import re
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

TABLE_FORMAT = 1
DEFAULT_OP = "mla_decoding_split_kv"  # MLA_DECODING.name in tilegym.ops.mla_decoding
TABLES_PACKAGE_DIR = "selection_tables"
GENERATOR = "python -m tilegym selection-table"

# Upper bucket edges (inclusive) per selection feature; a value above the last edge is ">last".
BUCKET_EDGES: dict[str, tuple[int, ...]] = {
    "rows_per_kv": (16, 32, 64),
    "batch": (1, 8, 32, 64, 128),
    "length_hint": (2048, 4096, 8192, 32768),
}
RELAXED_LAYOUT = "dense"

# Device-name model (a whole word of the report's environment.device) -> arch, for reports
# without environment.arch.
DEVICE_ARCH: dict[str, str] = {
    "A100": "sm_80",
    "A800": "sm_80",
    "L4": "sm_89",
    "L40S": "sm_89",
    "H100": "sm_90",
    "H200": "sm_90",
    "H800": "sm_90",
    "H20": "sm_90",
    "GH200": "sm_90",
    "B200": "sm_100",
    "GB200": "sm_100",
    "MI300X": "gfx942",
    "MI325X": "gfx942",
    "MI350X": "gfx950",
    "MI355X": "gfx950",
    "CPU": "cpu",
}

SCORE_DOC = "geometric mean over the regime's shapes of time_us / fastest time_us in that shape (1.0 = always fastest)"


# --- regimes ------------------------------------------------------------------------------------


def bucket_index(value: int, edges: Sequence[int]) -> int:
    """Index of the bucket holding ``value`` (``len(edges)`` when above the last edge)."""
    return next((i for i, edge in enumerate(edges) if value <= edge), len(edges))


def bucket(value: int, edges: Sequence[int]) -> str:
    """Label of the bucket holding ``value``: "<=edge" for the first edge it fits, else ">last"."""
    index = bucket_index(value, edges)
    return f"<={edges[index]}" if index < len(edges) else f">{edges[-1]}"


@dataclass(frozen=True)
class Regime:
    """The bucketed selection features of a call: the key of a table row."""

    rows_per_kv: str
    batch: str
    length: str
    layout: str
    kv_dtype: str

    @property
    def key(self) -> str:
        return f"rows_per_kv{self.rows_per_kv}/batch{self.batch}/length{self.length}/{self.layout}/{self.kv_dtype}"

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def regime_of(features: Mapping[str, Any], edges: Mapping[str, Sequence[int]] = BUCKET_EDGES) -> Regime:
    """Bucket a call's ``selection_features()`` with ``edges``."""
    return Regime(
        rows_per_kv=bucket(int(features["rows_per_kv"]), edges["rows_per_kv"]),
        batch=bucket(int(features["batch"]), edges["batch"]),
        length=bucket(int(features["length_hint"]), edges["length_hint"]),
        layout=str(features.get("layout", "dense")),
        kv_dtype=str(features["kv_dtype"]),
    )


# --- architectures ------------------------------------------------------------------------------


@functools.cache
def _cuda_arch(index: int) -> str:
    if torch.version.hip:
        return torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def device_arch(device: torch.device | str) -> str:
    """``sm_XY`` (NVIDIA), the gfx name (AMD) or "cpu"; cached per device index."""
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    return _cuda_arch(device.index if device.index is not None else torch.cuda.current_device())


def vendor_of_arch(arch: str) -> str:
    """The device vendor of an arch name."""
    if arch.startswith("sm_"):
        return "nvidia"
    if arch.startswith("gfx"):
        return "amd"
    return "cpu"


def arch_from_device_name(name: str) -> str:
    """Arch of a report's ``environment.device`` (e.g. "NVIDIA H200 (132 SMs/CUs)") via ``DEVICE_ARCH``."""
    model = name.split("(")[0]
    for token, arch in DEVICE_ARCH.items():
        if re.search(rf"\b{re.escape(token)}\b", model, re.IGNORECASE):
            return arch
    raise ValueError(f"no arch known for device {name!r}: add environment.arch to the report or pass --arch")


# --- tables -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableRow:
    """One regime of a table: backends ranked by score, and the measured shapes behind it."""

    key: str
    ranking: tuple[Mapping[str, Any], ...]
    evidence: tuple[Mapping[str, Any], ...]

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(r["backend"] for r in self.ranking)


@dataclass(frozen=True)
class SelectionTable:
    """A loaded, validated table for one arch."""

    arch: str
    edges: Mapping[str, tuple[int, ...]]
    sources: tuple[Mapping[str, Any], ...]
    ops: Mapping[str, Mapping[str, TableRow]]
    origin: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str) -> SelectionTable:
        """Validate a table's JSON (raises ``ValueError`` naming what is wrong)."""
        if data.get("format") != TABLE_FORMAT:
            raise ValueError(f"{origin}: format {data.get('format')!r}, expected {TABLE_FORMAT}")
        try:
            edges = {name: tuple(int(e) for e in data["buckets"][name]) for name in BUCKET_EDGES}
            ops = {
                op: {key: TableRow(key, tuple(row["ranking"]), tuple(row["evidence"])) for key, row in rows.items()}
                for op, rows in data["ops"].items()
            }
            return cls(str(data["arch"]), edges, tuple(data["sources"]), ops, origin)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{origin}: malformed selection table ({type(exc).__name__}: {exc})") from exc

    def lookup(self, op: str, features: Mapping[str, Any]) -> tuple[Regime, TableRow | None, str]:
        """The call's regime, its row (or None) and a note when the layout was relaxed to dense."""
        regime = regime_of(features, self.edges)
        rows = self.ops.get(op, {})
        if regime.key in rows:
            return regime, rows[regime.key], ""
        relaxed = Regime(regime.rows_per_kv, regime.batch, regime.length, RELAXED_LAYOUT, regime.kv_dtype)
        if regime.layout != RELAXED_LAYOUT and relaxed.key in rows:
            note = f"no {regime.layout} measurements in this regime: used the {RELAXED_LAYOUT} row"
            return regime, rows[relaxed.key], note
        return regime, None, ""


class TableStore:
    """Selection tables by arch, read lazily from a directory (default: the package's tables)."""

    def __init__(self, directory: str | Path | Traversable | None = None, *, read_files: bool = True) -> None:
        self._directory = directory
        self._read_files = read_files
        self._tables: dict[str, tuple[SelectionTable | None, str]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_tables(cls, *tables: Mapping[str, Any]) -> TableStore:
        """A store holding the given table dicts (each under its own ``arch``), reading no files."""
        store = cls(read_files=False)
        for data in tables:
            table = SelectionTable.from_dict(data, origin=f"in-memory table for {data.get('arch')}")
            store._tables[table.arch] = (table, "")
        return store

    def get(self, arch: str) -> tuple[SelectionTable | None, str]:
        """The table for ``arch``, or None and the reason there is none."""
        with self._lock:
            if arch not in self._tables:
                self._tables[arch] = self._load(arch)
            return self._tables[arch]

    def _root(self) -> Traversable | Path | None:
        if not self._read_files:
            return None
        if self._directory is None:
            return importlib.resources.files("tilegym") / TABLES_PACKAGE_DIR
        return Path(self._directory) if isinstance(self._directory, str) else self._directory

    def _load(self, arch: str) -> tuple[SelectionTable | None, str]:
        root = self._root()
        if root is None:
            return None, f"no selection table for {arch}"
        path = root / f"{arch}.json"
        if not path.is_file():
            return None, f"no selection table for {arch} ({arch}.json not in {root})"
        try:
            table = SelectionTable.from_dict(json.loads(path.read_text()), origin=f"{arch}.json")
        except (ValueError, OSError) as exc:
            return None, f"selection table {arch}.json not used: {exc}"
        if table.arch != arch:
            return None, f"selection table {arch}.json not used: it was measured on {table.arch}, not {arch}"
        return table, ""


# --- plans: the order ``auto`` tries backends in ------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The order ``auto`` tries backends in for one call, and why."""

    op: str
    vendor: str
    arch: str
    order: tuple[str, ...]
    basis: str
    regime: Regime | None = None
    row: TableRow | None = None
    table: SelectionTable | None = field(default=None, repr=False)
    features: Mapping[str, Any] | None = None


def make_plan(op: str, call: Any, arch: str, priority: Sequence[str], tables: TableStore) -> Plan:
    """Order the backends for ``call``: the table row's ranking, then ``priority`` (vendor list)."""
    vendor, priority = call.vendor, tuple(priority)
    get_features = getattr(call, "selection_features", None)
    if get_features is None:
        return Plan(op, vendor, arch, priority, f"vendor priority for {vendor}: the call offers no selection features")
    features = dict(get_features())
    table, why = tables.get(arch)
    if table is None:
        return Plan(op, vendor, arch, priority, f"vendor priority for {vendor}: {why}", features=features)
    regime, row, note = table.lookup(op, features)
    if row is None:
        basis = f"vendor priority for {vendor}: regime {regime.key} of {op} was not measured on {arch}"
        return Plan(op, vendor, arch, priority, basis, regime, None, table, features)
    order = row.order + tuple(b for b in priority if b not in row.order)
    basis = f"measured on {arch}: regime {row.key}" + (f" ({note})" if note else "")
    return Plan(op, vendor, arch, order, basis, regime, row, table, features)


# --- building tables from bench JSON ------------------------------------------------------------

_SHAPE_FIELDS = ("batch", "seq_len", "heads", "q_len", "layout", "page_size", "lengths", "dtype", "kv_dtype")


def _source_name(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def report_arch(report: Mapping[str, Any]) -> str:
    """A bench report's arch: ``environment.arch``, else from ``environment.device``."""
    env = report.get("environment", {})
    return str(env["arch"]) if env.get("arch") else arch_from_device_name(str(env.get("device", "")))


def _shape(row: Mapping[str, Any]) -> dict[str, Any]:
    shape = {name: row.get(name) for name in _SHAPE_FIELDS}
    shape["q_len"] = shape["q_len"] or 1
    shape["layout"] = shape["layout"] or "dense"
    shape["kv_dtype"] = shape["kv_dtype"] or shape["dtype"]
    return {k: v for k, v in shape.items() if v is not None}


def _features(shape: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "rows_per_kv": shape["heads"] * shape["q_len"],
        "batch": shape["batch"],
        "length_hint": shape["seq_len"],
        "layout": shape["layout"],
        "kv_dtype": shape["kv_dtype"],
    }


def _measurements(report: Mapping[str, Any], source: str) -> list[dict[str, Any]]:
    """One entry per measured shape: the shape, ok times per backend, and why others have none."""
    shapes: dict[str, dict[str, Any]] = {}
    for row in report["rows"]:
        shape = _shape(row)
        entry = shapes.setdefault(
            json.dumps(shape, sort_keys=True), {"source": source, **shape, "time_us": {}, "not_ok": {}}
        )
        backend, time_us = row["backend"], row.get("time_us")
        if row.get("status") == "ok" and time_us:
            entry["time_us"][backend] = round(min(time_us, entry["time_us"].get(backend, math.inf)), 3)
        else:
            note = row.get("note")
            entry["not_ok"][backend] = f"{row.get('status')}: {note}" if note else str(row.get("status"))
    return [e for e in shapes.values() if e["time_us"]]


def _ranking(evidence: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    ratios: dict[str, list[float]] = defaultdict(list)
    for shape in evidence:
        fastest = min(shape["time_us"].values())
        for backend, time_us in shape["time_us"].items():
            ratios[backend].append(time_us / fastest)
    scored = [
        {"backend": b, "score": round(math.exp(sum(map(math.log, r)) / len(r)), 4), "shapes": len(r)}
        for b, r in ratios.items()
    ]
    return sorted(scored, key=lambda s: (s["score"], s["backend"]))


def _regime_order(entry: Mapping[str, Any]) -> tuple:
    features = _features(entry)
    indices = tuple(bucket_index(features[name], edges) for name, edges in BUCKET_EDGES.items())
    return (*indices, features["layout"], features["kv_dtype"])


def _evidence_order(entry: Mapping[str, Any]) -> tuple:
    numbers = tuple(entry.get(name) or 0 for name in ("batch", "seq_len", "heads", "q_len", "page_size"))
    return (
        entry["source"],
        *numbers,
        *(str(entry.get(name, "")) for name in ("layout", "lengths", "dtype", "kv_dtype")),
    )


def build_tables(json_paths: Iterable[str | Path], arch: str | None = None) -> dict[str, dict[str, Any]]:
    """Arch -> table built from bench reports (``arch`` overrides every report's own)."""
    reports: dict[str, Path] = {}
    for path in map(Path, json_paths):
        if reports.setdefault(_source_name(path), path).resolve() != path.resolve():
            raise ValueError(f"two reports named {_source_name(path)}: {reports[_source_name(path)]} and {path}")
    per_arch: dict[str, dict[str, Any]] = {}
    for source in sorted(reports):
        report = json.loads(reports[source].read_text())
        env = report.get("environment", {})
        entry = per_arch.setdefault(arch or report_arch(report), {"sources": [], "shapes": defaultdict(list)})
        ok_rows = sum(row.get("status") == "ok" for row in report["rows"])
        entry["sources"].append(
            {"file": source, "date_utc": env.get("date_utc"), "device": env.get("device"), "ok_rows": ok_rows}
        )
        entry["shapes"][report.get("op", DEFAULT_OP)].extend(_measurements(report, source))
    return {a: _table(a, e["sources"], e["shapes"]) for a, e in sorted(per_arch.items())}


def _table(arch: str, sources: list[dict[str, Any]], shapes: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    ops: dict[str, dict[str, Any]] = {}
    for op in sorted(shapes):
        regimes: dict[Regime, list[dict[str, Any]]] = defaultdict(list)
        for entry in shapes[op]:
            regimes[regime_of(_features(entry))].append(entry)
        ops[op] = {
            regime.key: {
                "regime": regime.as_dict(),
                "ranking": _ranking(rows),
                "evidence": sorted(rows, key=_evidence_order),
            }
            for regime, rows in sorted(regimes.items(), key=lambda item: _regime_order(item[1][0]))
        }
    return {
        "format": TABLE_FORMAT,
        "arch": arch,
        "generated_by": GENERATOR,
        "score": SCORE_DOC,
        "buckets": {name: list(edges) for name, edges in BUCKET_EDGES.items()},
        "sources": sources,
        "ops": ops,
    }


def build_table(json_paths: Iterable[str | Path], arch: str | None = None) -> dict[str, Any]:
    """The table built from bench reports that all come from one arch (else ``ValueError``)."""
    tables = build_tables(json_paths, arch)
    if len(tables) != 1:
        raise ValueError(f"reports span {len(tables)} archs ({', '.join(tables) or 'none'}); use build_tables")
    return next(iter(tables.values()))


def table_json(table: Mapping[str, Any]) -> str:
    """The table as written to disk: stable, one line per source, ranking entry and measured shape."""
    return _dump(table, 0) + "\n"


def _dump(value: Any, depth: int) -> str:
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    if depth > 4 or not any(isinstance(v, (dict, list)) for v in items):
        return json.dumps(value)
    pad = " " * (depth + 1)
    if isinstance(value, dict):
        body = [f"{pad}{json.dumps(k)}: {_dump(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(body) + "\n" + " " * depth + "}"
    return "[\n" + ",\n".join(pad + _dump(v, depth + 1) for v in value) + "\n" + " " * depth + "]"


def table_sources(table_path: Path, results_dir: Path) -> list[Path]:
    """The reports a written table lists under ``sources``, as paths under ``results_dir``."""
    table = json.loads(table_path.read_text())
    return [results_dir / source["file"] for source in table.get("sources", [])]


def main(argv: Sequence[str] | None = None) -> int:
    """``selection-table REPORT.json... [--out DIR] [--arch ARCH]``: write DIR/<arch>.json per arch.

    ``--refresh``: rebuild every table in DIR from the reports it lists, read again from ``--results``
    (run it after re-running any suite, so the table never lags its reports)."""
    parser = argparse.ArgumentParser(prog="python -m tilegym selection-table", description=main.__doc__)
    parser.add_argument("reports", nargs="*", type=Path, help="bench JSON reports (rows with status 'ok' count)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / TABLES_PACKAGE_DIR)
    parser.add_argument("--arch", help="arch of every report (default: environment.arch or the device name)")
    parser.add_argument("--refresh", action="store_true", help="rebuild the tables in --out from their own sources")
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"), help="where --refresh reads")
    args = parser.parse_args(argv)
    if args.refresh == bool(args.reports):
        parser.error("give either report files or --refresh")
    reports = list(args.reports)
    if args.refresh:
        tables = sorted(args.out.glob("*.json"))
        if not tables:
            parser.error(f"--refresh: no tables in {args.out}")
        reports = [path for table in tables for path in table_sources(table, args.results)]
        missing = [str(path) for path in reports if not path.is_file()]
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            parser.error(f"--refresh: {len(missing)} reports not found under {args.results}: {shown}")
    args.out.mkdir(parents=True, exist_ok=True)
    for arch, table in build_tables(reports, args.arch).items():
        path = args.out / f"{arch}.json"
        path.write_text(table_json(table))
        regimes = sum(len(rows) for rows in table["ops"].values())
        print(f"wrote {path}: {regimes} regimes from {len(table['sources'])} reports")
    return 0


# --- explain ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShapeQuery:
    """A call described only by its selection features (what ``explain`` gets from shape arguments)."""

    vendor: str
    device: torch.device
    features: Mapping[str, Any]

    def selection_features(self) -> dict[str, Any]:
        return dict(self.features)


CHECK_INPUTS, CHECK_ENVIRONMENT, CHECK_NOTHING = "inputs", "environment", "nothing"


@dataclass(frozen=True)
class Explanation:
    """What ``auto`` picks for one call and why; ``str()`` is the report."""

    plan: Plan
    picked: str | None
    reasons: Mapping[str, tuple[str, ...]]
    checked: str
    checks_note: str

    def __str__(self) -> str:
        plan = self.plan
        picked = self.picked or "nothing (no backend can run it)"
        lines = [f"{plan.op} on {plan.arch} ({plan.vendor}): auto picks {picked}", f"basis: {plan.basis}"]
        if plan.features is not None:
            lines.append("features: " + ", ".join(f"{k}={v}" for k, v in plan.features.items()))
        if plan.regime is not None:
            lines.append(f"regime: {plan.regime.key}")
        lines += _row_lines(plan)
        lines.append(f"order tried: {', '.join(plan.order) or '(none)'}")
        lines += [f"skipped {b}: {'; '.join(r)}" for b, r in self.reasons.items() if r]
        lines.append(f"checked: {self.checks_note}")
        return "\n".join(lines)


def _row_lines(plan: Plan) -> list[str]:
    if plan.row is None or plan.table is None:
        return []
    lines = [f"measured ranking (score: {SCORE_DOC}):"]
    lines += [f"  {r['backend']:8s} {r['score']:.3f} over {r['shapes']} shape(s)" for r in plan.row.ranking]
    lines.append("shapes behind it:")
    for shape in plan.row.evidence:
        dims = f"B={shape['batch']} S={shape['seq_len']} H={shape['heads']} Q={shape['q_len']}"
        extra = " ".join(str(shape[k]) for k in ("layout", "page_size", "lengths", "kv_dtype") if k in shape)
        times = ", ".join(f"{b} {t:.1f} us" for b, t in sorted(shape["time_us"].items(), key=lambda bt: bt[1]))
        missing = "".join(f"; {b} {why}" for b, why in sorted(shape["not_ok"].items()))
        lines.append(f"  {dims} {extra} [{shape['source']}]: {times}{missing}")
    dates = ", ".join(f"{s['file']} ({s['date_utc']})" for s in plan.table.sources)
    lines.append(f"table: {plan.table.origin}, from {dates}")
    return lines


def explain(
    call: Any = None,
    *,
    batch: int | None = None,
    seq_len: int | None = None,
    heads: int | None = None,
    q_len: int = 1,
    layout: str = "dense",
    kv_dtype: str = "bf16",
    device: torch.device | str | None = None,
    arch: str | None = None,
    op: str = DEFAULT_OP,
    registry: Any = None,
) -> Explanation:
    """Which backend ``auto`` picks for a validated ``call`` (or for shape arguments), and why.

    A call is checked by every backend (``reasons(call)``). Shape arguments are checked only at
    the environment level (probes, vendors), and not at all when ``arch`` is not the device's
    own (e.g. explaining an H200 choice on a CPU machine).
    """
    from tilegym.backend import default_registry

    registry = registry or default_registry
    if call is None:
        call, arch, checked, note = _shape_query(batch, seq_len, heads, q_len, layout, kv_dtype, device, arch)
    else:
        checked, note = CHECK_INPUTS, "the call's inputs, by each backend tried"
    plan = registry.plan(op, call, arch=arch)
    impls = registry.implementations(op)
    picked, reasons = None, {}
    for name in plan.order:
        found = _reasons(registry, impls.get(name), name, call, checked)
        reasons[name] = tuple(found)
        if not found:
            picked = name
            break
    return Explanation(plan, picked, reasons, checked, note)


def _reasons(registry: Any, impl: Any, name: str, call: Any, checked: str) -> list[str]:
    if impl is None:
        return registry.missing_reasons(name)
    if checked == CHECK_INPUTS:
        return impl.reasons(call)
    if checked == CHECK_ENVIRONMENT:
        return impl.reasons_for_vendor(call.vendor)
    return []


def _shape_query(
    batch: int | None,
    seq_len: int | None,
    heads: int | None,
    q_len: int,
    layout: str,
    kv_dtype: str,
    device: torch.device | str | None,
    arch: str | None,
) -> tuple[ShapeQuery, str, str, str]:
    if batch is None or seq_len is None or heads is None:
        raise TypeError("explain needs a validated call or batch=, seq_len= and heads=")
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    local = device_arch(device)
    arch = arch or local
    features = {"rows_per_kv": heads * q_len, "batch": batch, "length_hint": seq_len, "layout": layout}
    query = ShapeQuery(vendor_of_arch(arch), device, {**features, "kv_dtype": kv_dtype})
    if arch == local:
        return query, arch, CHECK_ENVIRONMENT, "environment only (probes, vendors); pass a call to check inputs"
    note = f"nothing: explaining {arch} from a {local} device; each backend's input limits still apply"
    return query, arch, CHECK_NOTHING, note


def explain_main(argv: Sequence[str] | None = None) -> int:
    """``explain --shape B,S,H[,Q] [--layout L] [--kv-dtype T] [--arch A]``: print what auto picks."""
    parser = argparse.ArgumentParser(prog="python -m tilegym explain", description=explain_main.__doc__)
    parser.add_argument("--shape", required=True, help="batch,seq_len,heads[,q_len] (seq_len: the longest row)")
    parser.add_argument("--layout", default="dense", choices=("dense", "paged", "ragged"))
    parser.add_argument("--kv-dtype", default="bf16")
    parser.add_argument("--arch", help="explain for this arch (e.g. sm_90) instead of this machine's device")
    parser.add_argument("--op", default=DEFAULT_OP)
    args = parser.parse_args(argv)
    try:
        dims = [int(x) for x in args.shape.split(",")]
        batch, seq_len, heads, q_len = (*dims, 1) if len(dims) == 3 else dims
    except ValueError:
        parser.error(f"--shape: expected B,S,H or B,S,H,Q integers, got {args.shape!r}")
    explanation = explain(
        batch=batch,
        seq_len=seq_len,
        heads=heads,
        q_len=q_len,
        layout=args.layout,
        kv_dtype=args.kv_dtype,
        arch=args.arch,
        op=args.op,
    )
    print(explanation)
    return 0
