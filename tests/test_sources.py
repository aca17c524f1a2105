"""A kernel's source closure and verify's check hash come from its imports, not from lists."""
from __future__ import annotations

import dataclasses

from kernels.registry import KERNELS
from pipeline.config import ROOT
from pipeline.sources import check_hash, imported_modules, source_files, source_sha256


def test_closure_follows_the_imports():
    names = {p.name for p in source_files(KERNELS["hslm_fwd_s8"])}
    # the kernel module, what it imports, and what those import (staged_tile -> ptx_emit)
    assert names == {"hslm_fwd_s8.py", "staged_tile.py", "pitch.py", "planes.py", "ptx_emit.py", "spec.py", "ternary.py",
                     "testdata.py", "reference.py", "validate.py"}
    assert all(p.is_relative_to(ROOT / "kernels") for spec in KERNELS.values() for p in source_files(spec))


def test_every_import_form_is_seen(tmp_path):
    module = tmp_path / "k.py"
    module.write_text("import numpy as np\nimport kernels.ternary\nfrom kernels import staged_tile, spec\n"
                      "from kernels.testdata import pack\nfrom os import path\n"
                      "def late():\n    from kernels.quant import quantize_rows\n")
    assert imported_modules(module) == {"kernels.ternary", "kernels.staged_tile", "kernels.spec",
                                        "kernels.testdata", "kernels.quant"}


def test_check_hash_covers_reference_and_inputs_not_the_emitter():
    spec = KERNELS["hslm_dx_s8"]
    base = check_hash(spec)
    assert check_hash(dataclasses.replace(spec, emit=lambda: "// other")) == base
    assert check_hash(dataclasses.replace(spec, reference=lambda d, i: 0)) != base
    assert check_hash(dataclasses.replace(spec, make_inputs=lambda d, rng: {})) != base
    by_family = {s.family_name: source_sha256(s) for s in KERNELS.values()}  # a family's configurations share a module
    assert len(set(by_family.values())) == len(by_family) == 3
    assert all(source_sha256(s) == by_family[s.family_name] for s in KERNELS.values())
