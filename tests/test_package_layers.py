"""The package's import structure: no module imports itself back through others, and every
import goes down the declared floors (a room never imports one above it)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

from hslm_ptx.pipeline.core.config import ROOT

PACKAGE = ROOT / "hslm_ptx"
# bottom first; a room is a subpackage or a top-level module (its dotted name under hslm_ptx)
FLOORS = (
    ("validate", "cost", "formats"),
    ("kernel", "reference"),
    ("emit", "emu"),
    ("tile", "runtime"),
    ("families",),
    ("catalog",),
    ("step", "arrays", "emu_bench"),
    ("nn",),
    ("pipeline.core",),
    ("pipeline.bench",),
    ("pipeline.stages",),
    ("pipeline.ratchet",),
    ("pipeline.tasks",),
)
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """The package modules ``path`` imports, anywhere in the file (a function's late import too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in known:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            found |= subs or {node.module}
            if len(subs) < len(node.names):
                found.add(node.module)
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imports(path, set(files)) - {name} for name, path in files.items()}


def room(module: str) -> str | None:
    rest = module.removeprefix("hslm_ptx.").split(".")
    if rest[0] == "pipeline":
        return ".".join(rest[:2]) if len(rest) > 1 else None
    return rest[0] if rest[0] != "hslm_ptx" else None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected set of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_back():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_planted_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_room_is_on_a_floor_and_imports_go_down():
    edges = graph()
    rooms = {room(m) for m in edges} - {None}
    assert rooms <= set(FLOOR), f"rooms with no floor: {sorted(rooms - set(FLOOR))}"
    up = [(a, b) for a, targets in edges.items() for b in targets
          if room(a) and room(b) and FLOOR[room(b)] > FLOOR[room(a)]]
    assert up == []


def test_an_import_up_a_floor_is_seen():
    assert FLOOR[room("hslm_ptx.formats.pitch")] < FLOOR[room("hslm_ptx.kernel.spec")]
    planted = {"hslm_ptx.formats.x": {"hslm_ptx.kernel.spec"}}
    up = [(a, b) for a, targets in planted.items() for b in targets if FLOOR[room(b)] > FLOOR[room(a)]]
    assert up == [("hslm_ptx.formats.x", "hslm_ptx.kernel.spec")]


def test_no_top_level_name_but_hslm_ptx():
    tops = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert tops == {"hslm_ptx"}


def test_durations_live_in_their_generated_page():
    """The README quotes no duration (a re-measure would be a README edit); the page is
    rendered from its record by the tool that measured it."""
    import re
    import runpy

    readme = (ROOT / "README.md").read_text()
    assert not re.search(r"\b\d+ min \d+ s\b|\bmedian \d+\.\d+ s\b", readme)
    assert "docs/durations.md" in readme
    tool = runpy.run_path(str(ROOT / "tools" / "durations.py"))
    record = json.loads((ROOT / "docs" / "durations.json").read_text())
    assert tool["render"](record) == (ROOT / "docs" / "durations.md").read_text()
    assert "9 min 24 s" in tool["render"]({"verify-cold": {"figure": "9 min 24 s", "detail": "", "machine": "m",
                                                         "when": "d"}})  # a row is rendered: the check can fail
