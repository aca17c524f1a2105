"""Every count the docs state about the product is the registry's and the ledger's: a
count that drifts (a kernel added, a shape set grown) fails here instead of going stale."""
from __future__ import annotations

import json
from pathlib import Path

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.request import VARIABLES
from hslm_ptx.pipeline.core.shapes import select_sets

ROOT = Path(__file__).resolve().parent.parent


def counts() -> dict[str, int]:
    kernels = len(KERNELS)
    shapes = sum(len(found) for found in select_sets(config.VERIFY_SETS).values())
    return {"kernels": kernels, "shapes": shapes, "archs": len(config.ARCHS), "verify": kernels * shapes,
            "gate": kernels * (shapes + len(config.ARCHS) + 1)}


def stated(n: dict[str, int]) -> list[tuple[str, str]]:
    """(page, the sentence that states a count), as each page words it."""
    return [
        ("docs/pipeline.md", f"read the {n['kernels']} indexes, not the {n['verify']} reports"),
        ("docs/pipeline.md", f"`doit verify` runs {n['kernels']} kernels on the {n['shapes']} shapes of "
                             f"smoke, tails and hslm: {n['verify']} cells"),
        ("docs/pipeline.md", f"`doit gate` judges {n['gate']}: each kernel's {n['shapes']} verify cells, its "
                             f"{n['archs']} ptxas archs and its kernel tests ({n['kernels']} x "
                             f"{n['shapes'] + n['archs'] + 1})"),
        ("docs/adding-a-stage.md", f"`verify: {n['verify']} cells on emulator (all up to date): all exact`"),
        ("docs/cluster.md", f"`120/{n['verify']} cells done"),
        ("docs/adding-a-kernel.md", f"NEW KERNEL my_kernel: {n['shapes'] + n['archs'] + 1} cells "
                                    f"({n['shapes'] + n['archs'] + 1} pass, 0 not passing, 0 not run)"),
    ]


def test_the_gate_count_is_the_ledgers():
    entries = json.loads((ROOT / "ledger" / "ledger.json").read_text())["entries"]
    assert len(entries) == counts()["gate"]
    assert sum(e["check"] == "verify" for e in entries) == counts()["verify"]


def test_every_stated_count_is_current():
    for page, sentence in stated(counts()):
        assert sentence in " ".join((ROOT / page).read_text().split()), f"{page}: no '{sentence}'"


def test_a_stale_count_is_caught():
    stale = {**counts(), "kernels": counts()["kernels"] - 1}
    missing = [s for page, s in stated(stale) if s not in " ".join((ROOT / page).read_text().split())]
    assert len(missing) >= 3  # every sentence naming the kernel count


def test_the_variables_table_lists_every_variable_once():
    """docs/pipeline.md's table of command-line variables: its first column is VARIABLES, in order."""
    text = (ROOT / "docs" / "pipeline.md").read_text()
    table = text.split("| variable | values | default | read by |\n| --- | --- | --- | --- |\n", 1)[1].split("\n\n", 1)[0]
    assert [row.split("`")[1] for row in table.splitlines()] == list(VARIABLES)
