"""The committed stores beside the ledger, judged as the ledger is: a loosening is red
unless ``doit bless`` recorded it.

The stores are the files the model, the layer ratchet and the seals take as given:
the layer step's levels (ledger/layer.json, written by bless itself), the loop counts
(hslm_ptx/cost/loop_counts.json, written by ``doit model:counts``), the calibration points
(hslm_ptx/cost/calibration.yaml), the shape sets (shapes.yaml), the device figures
(hslm_ptx/cost/devices.json) and the set of files under tests/.

- **Pins** (ledger/stores.json, written by ``doit bless``: :func:`write_pins`): the
  sha256 of each store and the list of test files. Without a base, a store that is not
  what bless pinned is ``STALE SEAL``, a pinned test file that is gone ``STALE SEAL``, a
  test file bless did not pin ``UNLISTED`` (:func:`pin_findings`): no edit of a store,
  and no deleted test, passes until bless records it.
- **Loosenings against base=REF** (:func:`loosenings`): each store as committed at REF
  against the one now, item by item: a layer level raised, or a ``reason``/``rose_from``
  that bless did not write (bless keeps the level before a rise in ``rose_from``); a loop
  count that changed on the same PTX (every field the model reads); a calibration point
  whose ``fit`` flag flipped, whose ``published`` figure or inputs changed, or that is
  gone (points are matched by ``name``; fields the base lacks are not compared, so a
  point may gain fields such as ``why``); a shape shrunk under its name or gone from its
  set; a test file gone. Each carries a reason when bless recorded it (the layer level's
  reason; for the other stores, a pin of the content now): the gate prints those as
  ``ACCEPTED LOOSENING`` and the rest as ``LOOSENED``.
- **Quoted figures** (:func:`calibration_findings`): each calibration point's
  ``published`` figure is a figure of the line its ``source`` quotes (between single
  quotes; the same number), or the TOPS of a quoted GB/s figure by sgl-kernel's
  bench_int8_gemm.py formula (the int8 points, hslm_ptx/cost/calibration.yaml's header), rounded
  to the decimals ``published`` is written with: ``UNSOURCED`` otherwise.

Readers take the text of each store (from disk, or from ``git show REF:path``), so the
same code judges the working tree and the base.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Iterable, Literal, NamedTuple

from pydantic import ValidationError

from hslm_ptx.pipeline.core import config, proc
from hslm_ptx.pipeline.core.artifacts import field_error, parse_json, parse_yaml, read_document
from hslm_ptx.pipeline.core.errors import ArtifactError
from hslm_ptx.pipeline.core.files import sha256_bytes, write_atomic
from hslm_ptx.pipeline.core.layer_records import LayerLedger
from hslm_ptx.pipeline.core.models import Record
from hslm_ptx.pipeline.ratchet.layer_ratchet import rises

LEDGER = "ledger/ledger.json"
PINS = "ledger/stores.json"
LAYER = "ledger/layer.json"
COUNTS = "hslm_ptx/cost/loop_counts.json"
CALIBRATION = "hslm_ptx/cost/calibration.yaml"
SHAPES = "shapes.yaml"
DEVICES = "hslm_ptx/cost/devices.json"
PINNED: tuple[str, ...] = (COUNTS, CALIBRATION, SHAPES, DEVICES)  # layer.json is bless's own output
TESTS = "tests"
FIX = "doit bless (pins the stores and the test files as they are now)"


class StorePins(Record):
    """ledger/stores.json: what ``doit bless`` saw of each store and of tests/."""

    schema_version: Literal[1] = 1
    files: dict[str, str]  # path -> sha256 of its bytes
    test_files: list[str]


class Snapshot(NamedTuple):
    """The stores at one point (the working tree, or a commit): each path's text (None when
    absent), the test files, and the pins."""

    where: str  # "" for the working tree, else the ref
    texts: dict[str, str | None]
    test_files: tuple[str, ...]
    pins: StorePins | None


class Loosening(NamedTuple):
    """One way a store is looser than at the base; ``reason``: what bless recorded for it."""

    subject: str
    what: str
    reason: str | None
    fix: str


StoreFinding = tuple[str, str, str, str]  # (kind, subject, what, fix), the gate's Finding fields


# ---- reading --------------------------------------------------------------------------

def test_files(root: Path) -> tuple[str, ...]:
    """Every Python file under tests/ (test modules, helpers, conftest), relative to ``root``."""
    folder = Path(root) / TESTS
    return tuple(sorted(p.relative_to(root).as_posix() for p in folder.rglob("*.py")
                        if "__pycache__" not in p.parts)) if folder.is_dir() else ()


def parse_pins(path: str, text: str | None) -> StorePins | None:
    if text is None:
        return None
    try:
        return StorePins.model_validate(parse_json(Path(path), text))
    except ValidationError as exc:
        raise ArtifactError(field_error(Path(path), exc)) from None


def working_tree(root: Path | None = None) -> Snapshot:
    """The stores as they are on disk; :class:`ArtifactError` when one cannot be read."""
    root = Path(root or config.ROOT)
    texts = {path: read_document(root / path) if (root / path).exists() or (root / path).is_symlink() else None
             for path in (*PINNED, LAYER, PINS)}
    return readable(Snapshot("", texts, test_files(root), parse_pins(PINS, texts[PINS])))


def readable(snap: Snapshot) -> Snapshot:
    """``snap``, once every store the rules compare parses (:class:`ArtifactError`, one line
    naming the file and the base, before any verdict)."""
    _layer(snap), points(snap), shape_dims(snap), _loaded(snap, DEVICES, parse_json)
    _mapping(_loaded(snap, COUNTS, parse_json), COUNTS, "kernels", snap)
    return snap


def git(root: Path, *args: str) -> tuple[int, str, str]:
    """(status, stdout, stderr) of one git command; a failure to run, or output that is not
    UTF-8 (a committed store with a stray byte), is status 1 and the line that says so."""
    try:
        done = proc.run(["git", "-C", str(root), *args])
    except OSError as exc:
        return 1, "", f"git could not run ({exc.strerror or exc})"
    except UnicodeDecodeError as exc:
        return 1, "", f"not UTF-8 (byte {exc.object[exc.start]:#04x} at offset {exc.start}); fix the file"
    return done.returncode, done.stdout, done.stderr


def commit_of(ref: str, root: Path | None = None) -> str:
    """The commit ``ref`` names; :class:`ArtifactError` (one line) when it names none. A
    reflog selector (``@{...}``) is refused: it says what this clone did, not what was
    committed, and git answers a date past the reflog with the nearest entry."""
    root = Path(root or config.ROOT)
    if "@{" in ref:
        raise ArtifactError(f"base={ref}: a reflog selector; give a commit, branch or tag (e.g. HEAD~1)")
    code, out, err = git(root, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    if code or not out.strip():
        why = (err.strip().splitlines() or ["no such commit"])[0]
        raise ArtifactError(f"base={ref}: not a commit of this repository ({why})")
    return out.strip()


def at_commit(ref: str, root: Path | None = None) -> Snapshot:
    """The stores as committed at ``ref``; :class:`ArtifactError` when ``ref`` is not a
    commit or holds no ledger (a base without one would compare nothing)."""
    root = Path(root or config.ROOT)
    commit = commit_of(ref, root)
    code, listing, err = git(root, "ls-tree", "-r", "--name-only", commit, "--", LEDGER, TESTS, *PINNED, LAYER, PINS)
    if code:
        raise ArtifactError(f"base={ref}: {(err.strip().splitlines() or ['git ls-tree failed'])[0]}")
    present = set(listing.splitlines())
    if LEDGER not in present:
        raise ArtifactError(f"base={ref}: has no {LEDGER}; give a commit that has one")
    texts: dict[str, str | None] = {}
    for path in (LEDGER, *PINNED, LAYER, PINS):
        if path not in present:
            texts[path] = None
            continue
        code, text, err = git(root, "show", f"{commit}:{path}")
        if code:
            raise ArtifactError(f"base={ref}: {path}: {(err.strip().splitlines() or ['git show failed'])[0]}")
        texts[path] = text
    tests = tuple(sorted(p for p in present if p.startswith(f"{TESTS}/") and p.endswith(".py")))
    try:
        pins = parse_pins(PINS, texts[PINS])
    except ArtifactError as exc:
        raise ArtifactError(f"base={ref}: {exc}") from None
    return readable(Snapshot(ref, texts, tests, pins))


def digest(text: str | None) -> str | None:
    return None if text is None else sha256_bytes(text.encode())


def pins_now(root: Path | None = None) -> StorePins:
    """What bless pins: the sha256 of every store present and the test files."""
    snap = working_tree(root)
    return StorePins(files={p: digest(t) for p, t in snap.texts.items() if p in PINNED and t is not None},
                     test_files=list(snap.test_files))


def planned_pins(path: Path | None = None, root: Path | None = None) -> tuple[StorePins, list[str]]:
    """The pins of the stores under ``root`` as bless will write them to ``path``
    (ledger/stores.json under ``root`` by default), and the lines that say what changed
    since the pins there; written by nobody yet, so a bless refuses before any write."""
    root = Path(root or config.ROOT)
    path = Path(path or root / PINS)
    old = parse_pins(PINS, read_document(path)) if path.exists() or path.is_symlink() else None
    new = pins_now(root)
    notes = [f"stores: pinned {name} ({'new' if old is None or name not in old.files else 'changed'})"
             for name, sha in new.files.items() if old is None or old.files.get(name) != sha]
    gone = sorted(set(old.test_files) - set(new.test_files)) if old else []
    added = sorted(set(new.test_files) - set(old.test_files)) if old else []
    notes += [f"stores: test file {name} is gone (recorded)" for name in gone]
    notes += [f"stores: test file {name} added" for name in added]
    return new, notes


def write_pins(path: Path | None = None, root: Path | None = None, pins: StorePins | None = None) -> list[str]:
    """Write ``pins`` (default: :func:`planned_pins`) to ``path``; the lines of the plan."""
    root = Path(root or config.ROOT)
    path = Path(path or root / PINS)
    planned, notes = planned_pins(path, root)
    write_atomic(path, (pins or planned).model_dump_json(indent=1) + "\n")
    return notes


# ---- without a base: the pins --------------------------------------------------------

def pin_findings(now: Snapshot) -> list[StoreFinding]:
    """Each store and test file against what bless pinned."""
    if now.pins is None:
        return [("UNSEALED", PINS, "no pins of the committed stores and test files", FIX)]
    found: list[StoreFinding] = []
    for path in PINNED:
        pinned, is_now = now.pins.files.get(path), digest(now.texts[path])
        if pinned != is_now:
            what = (f"{'absent' if is_now is None else 'changed'} since doit bless pinned it"
                    if pinned is not None else "present, and bless pinned no such file")
            found.append(("STALE SEAL", path, what, f"undo the edit, or {FIX}"))
    listed, present = set(now.pins.test_files), set(now.test_files)
    found += [("STALE SEAL", path, "a test file bless pinned is gone", f"git checkout it, or {FIX}")
              for path in sorted(listed - present)]
    found += [("UNLISTED", path, "a test file bless has not pinned", FIX) for path in sorted(present - listed)]
    return found


# ---- against a base: item by item -----------------------------------------------------

def _where(snap: Snapshot) -> str:
    """How an error line names the snapshot: ``base=REF: `` for a commit, nothing for the tree."""
    return f"base={snap.where}: " if snap.where else ""


def _loaded(snap: Snapshot, path: str, parse) -> object:
    text = snap.texts.get(path)
    if text is None:
        return None
    try:
        return parse(Path(path), text)
    except ArtifactError as exc:
        raise ArtifactError(f"{_where(snap)}{exc}") from None


def _layer(snap: Snapshot) -> LayerLedger | None:
    raw = _loaded(snap, LAYER, parse_json)
    try:
        return None if raw is None else LayerLedger.model_validate(raw)
    except ValidationError as exc:
        raise ArtifactError(_where(snap) + field_error(Path(LAYER), exc)) from None


def _mapping(raw: object, path: str, field: str, snap: Snapshot):
    """``raw[field]``: the list of calibration points, or the object of another store's entries."""
    if raw is None:
        return {}
    value = raw.get(field) if isinstance(raw, dict) else None
    if not isinstance(value, list if field == "points" else dict):
        raise ArtifactError(f"{_where(snap)}{path}: field '{field}': expected "
                            f"{'a list' if field == 'points' else 'an object'}")
    return value


def layer_loosenings(base: Snapshot, now: Snapshot, reasons: Iterable[str]) -> Iterable[Loosening]:
    """A level above the base's without what bless writes for a rise (a reason from the list,
    ``rose_from`` the level before it), a reason or rose_from set without a rise, a level
    dropped while its shape is still in shapes.yaml."""
    held, current = _layer(base), _layer(now)
    if held is None or current is None:
        return
    reasons = set(reasons)
    levels = {level.key: level for level in current.levels}
    shapes = shape_dims(now)
    for was in held.levels:
        subject = f"layer {was.shape_set}/{was.shape}"
        level = levels.get(was.key)
        if level is None:
            if was.key in shapes:
                yield Loosening(subject, "level dropped while the shape is in shapes.yaml", None,
                                "doit bless (keeps a level while its shape exists)")
            continue
        up = rises(was.level, level.level)
        if up:
            accepted = level.reason in reasons and level.rose_from == (was.rose_from or was.level)
            yield Loosening(subject, ", ".join(up), level.reason if accepted else None,
                            "doit bless accept_slower=<reason> records a rise (with the level before it)")
        elif (level.reason, level.rose_from) != (was.reason, was.rose_from) and level.rose_from is not None:
            yield Loosening(subject, f"reason {level.reason!r} and rose_from set without a rise", None,
                            "only doit bless sets them, on a rise")


def _leaves(value: object, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _leaves(item, f"{prefix}{key} ").items()}
    return {prefix.strip(): value}


def _pinned(now: Snapshot, path: str) -> str | None:
    """The reason a store's edit is accepted: bless pinned its content now."""
    pinned = now.pins.files.get(path) if now.pins else None
    return "pinned by doit bless" if pinned is not None and pinned == digest(now.texts.get(path)) else None


def counts_loosenings(base: Snapshot, now: Snapshot) -> Iterable[Loosening]:
    """A loop count of the same PTX that is not what it was: the cubin it was counted from did
    not change, so only a hand edit changes it (every field, issue clocks included); a kernel
    gone; an occupancy entry changed while its kernel's PTX did not."""
    held_raw, now_raw = _loaded(base, COUNTS, parse_json), _loaded(now, COUNTS, parse_json)
    if held_raw is None or now_raw is None:
        return
    held, current = _mapping(held_raw, COUNTS, "kernels", base), _mapping(now_raw, COUNTS, "kernels", now)
    accepted = _pinned(now, COUNTS)
    fix = "doit model:counts writes what the cubins say"
    same_ptx = set()
    for kernel, was in held.items():
        entry = current.get(kernel)
        if entry is None:
            yield Loosening(f"{COUNTS} {kernel}", "counts dropped", accepted, fix)
            continue
        if not isinstance(was, dict) or not isinstance(entry, dict) or was.get("ptx_sha256") != entry.get("ptx_sha256"):
            continue  # counted from other PTX: the counts rule checks them against the SASS records
        same_ptx.add(kernel)
        before, after = _leaves(was.get("archs")), _leaves(entry.get("archs"))
        changed = [f"{k} {before.get(k, '(absent)')} -> {after.get(k, '(absent)')}"
                   for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
        if changed:
            more = f" (+{len(changed) - 3} more)" if len(changed) > 3 else ""
            yield Loosening(f"{COUNTS} {kernel}", "same PTX, other counts: " + "; ".join(changed[:3]) + more,
                            accepted, fix)
    occupancy_was = held_raw.get("occupancy") if isinstance(held_raw, dict) else None
    occupancy_now = now_raw.get("occupancy") if isinstance(now_raw, dict) else None
    if isinstance(occupancy_was, dict) and isinstance(occupancy_now, dict):
        for kernel in sorted(same_ptx & set(occupancy_was)):
            if occupancy_now.get(kernel) != occupancy_was[kernel]:
                yield Loosening(f"{COUNTS} occupancy {kernel}", "same PTX, other ptxas figures", accepted, fix)


TEXT_FIELDS = frozenset({"name", "id", "note", "why", "source", "library"})  # words, not figures


def points(snap: Snapshot) -> dict[str, dict]:
    """The calibration points by name (``id`` where a point has no name)."""
    raw = _loaded(snap, CALIBRATION, parse_yaml)
    found = {}
    for number, point in enumerate(_mapping(raw, CALIBRATION, "points", snap) if raw is not None else [], 1):
        key = point.get("name", point.get("id")) if isinstance(point, dict) else None
        if not isinstance(key, str):
            raise ArtifactError(f"{_where(snap)}{CALIBRATION}: point {number}: field 'name': expected the point's name")
        found[key] = point
    return found


def calibration_loosenings(base: Snapshot, now: Snapshot) -> Iterable[Loosening]:
    """A point gone, its ``fit`` flag flipped (fit: true points are shown, not counted), its
    ``published`` figure or an input changed; a field the base lacks is not compared."""
    if base.texts.get(CALIBRATION) is None or now.texts.get(CALIBRATION) is None:
        return
    held, current, accepted = points(base), points(now), _pinned(now, CALIBRATION)
    fix = "undo the edit (a published figure is copied from its source, with the line)"
    for name, was in held.items():
        point = current.get(name)
        subject = f"{CALIBRATION} {name}"
        if point is None:
            yield Loosening(subject, "point removed", accepted, fix)
            continue
        if bool(was.get("fit", False)) != bool(point.get("fit", False)):
            yield Loosening(subject, f"fit {bool(was.get('fit', False))} -> {bool(point.get('fit', False))}",
                            accepted, fix)
        changed = [f"{k} {was[k]} -> {point.get(k, '(absent)')}" for k in was
                   if k not in TEXT_FIELDS and k != "fit" and point.get(k) != was[k]]
        if changed:
            yield Loosening(subject, "; ".join(changed), accepted, fix)


def shape_dims(snap: Snapshot) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(set, name) -> (R, K, N) of every shape (shapes.yaml is validated by its own reader
    where it is used; here an entry that is not a shape is skipped)."""
    raw = _loaded(snap, SHAPES, parse_yaml)
    found = {}
    for set_name, entries in (raw.items() if isinstance(raw, dict) else ()):
        for entry in entries if isinstance(entries, list) else ():
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                found[(str(set_name), entry["name"])] = tuple(entry.get(d) for d in ("R", "K", "N"))
    return found


def shape_loosenings(base: Snapshot, now: Snapshot) -> Iterable[Loosening]:
    """A shape shrunk under its name (R, K or N smaller) or gone from its set."""
    if base.texts.get(SHAPES) is None or now.texts.get(SHAPES) is None:
        return
    held, current, accepted = shape_dims(base), shape_dims(now), _pinned(now, SHAPES)
    for (set_name, name), was in held.items():
        dims = current.get((set_name, name))
        subject = f"{SHAPES} {set_name}/{name}"
        if dims is None:
            yield Loosening(subject, "shape removed", accepted, "undo the edit, or doit bless")
            continue
        smaller = [f"{d} {a} -> {b}" for d, a, b in zip("RKN", was, dims)
                   if isinstance(a, int) and (not isinstance(b, int) or b < a)]
        if smaller:
            yield Loosening(subject, "shrunk under its name: " + ", ".join(smaller), accepted,
                            "give the smaller shape a name of its own")


def test_loosenings(base: Snapshot, now: Snapshot) -> Iterable[Loosening]:
    """A test file committed at the base that is gone now (accepted once bless pinned its absence)."""
    pinned = set(now.pins.test_files) if now.pins else None
    for path in sorted(set(base.test_files) - set(now.test_files)):
        accepted = "pinned by doit bless" if pinned is not None and path not in pinned and \
            set(now.test_files) == pinned else None
        yield Loosening(path, "test file deleted", accepted, "git checkout it (or doit bless records its removal)")


def loosenings(base: Snapshot, now: Snapshot, reasons: Iterable[str]) -> list[Loosening]:
    """Every way the stores now are looser than at the base, store by store."""
    return [*layer_loosenings(base, now, reasons), *counts_loosenings(base, now), *calibration_loosenings(base, now),
            *shape_loosenings(base, now), *test_loosenings(base, now)]


# ---- the calibration points' quoted figures ---------------------------------------------

QUOTED = re.compile(r"'([^']*)'")
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def decimals(figure: float) -> int:
    text = repr(float(figure))
    return 0 if "e" in text or "." not in text else len(text.split(".")[1].rstrip("0"))


def int8_bench_tops(M: int, N: int, K: int, gbps: float) -> float:
    """TOPS from the GB/s column of sgl-kernel's bench_int8_gemm.py: its bytes are
    (2MNK - MN) x 1 + 3MN x 4, so seconds = bytes x 1e-9 / GB/s, TOPS = 2MNK / seconds / 1e12."""
    seconds = ((2 * M * N * K - M * N) + 3 * M * N * 4) * 1e-9 / gbps
    return 2 * M * N * K / seconds / 1e12


def quoted_figures(point: dict) -> tuple[list[float], list[float]]:
    """The figures the point's source quotes, and the TOPS each would state as the GB/s
    column of sgl-kernel's int8 bench (a GEMM point with M, N, K)."""
    quoted = [float(n) for part in QUOTED.findall(str(point.get("source", ""))) for n in NUMBER.findall(part)]
    dims = [point.get(d) for d in ("M", "N", "K")]
    gemm = point.get("kind") == "gemm" and all(type(d) is int and d > 0 for d in dims)
    return quoted, [int8_bench_tops(*dims, q) for q in quoted if q > 0] if gemm else []


def sourced(published: float, point: dict) -> bool:
    """``published`` is a quoted figure (the same number), or a derived one rounded to the
    decimals ``published`` is written with."""
    quoted, derived = quoted_figures(point)
    places = decimals(published)
    return (any(math.isclose(q, published, rel_tol=1e-12) for q in quoted)
            or any(math.isclose(round(t, places), published, rel_tol=1e-12) for t in derived))


def calibration_findings(now: Snapshot) -> list[StoreFinding]:
    """Each point whose ``published`` figure is not one its quoted source line states."""
    if now.texts.get(CALIBRATION) is None:
        return []
    found: list[StoreFinding] = []
    for name, point in points(now).items():
        published = point.get("published")
        if not isinstance(published, (int, float)) or isinstance(published, bool) or not math.isfinite(published):
            continue  # the model's reader refuses it, naming the field
        if not sourced(published, point):
            found.append(("UNSOURCED", f"{CALIBRATION} {name}",
                          f"published {published:g} is not a figure of its quoted source line",
                          "copy the figure from the source, with the line it is on, between single quotes"))
    return found
