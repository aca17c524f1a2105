"""A kernel's source closure and verify's check hash come from its imports, not from lists."""
from __future__ import annotations

import dataclasses

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core.config import ROOT
from hslm_ptx.pipeline.core import sources
from hslm_ptx.pipeline.core.sources import (SCORING, check_hash, closure, code_sha256, computed_check_hash,
                                            imported_modules, source_files, source_sha256)


def test_closure_follows_the_imports():
    files = source_files(KERNELS["hslm_fwd_s8"])
    names = {p.name for p in files}
    # the kernel module, what it imports, and what those import (tile/specs.py -> tile/mainloop.py -> emit/ptx.py)
    assert {"hslm_fwd_s8.py", "geometry.py", "specs.py", "rule.py", "operands.py", "mainloop.py", "epilogue.py",
            "planes.py", "ptx.py", "spec.py", "ternary.py", "testdata.py", "products.py"} <= names
    assert ROOT / "hslm_ptx" / "tile" / "__init__.py" in files
    # and nothing else: every other file is imported by one of them
    imported = {name for p in files for name in imported_modules(p)}
    assert all(p.name == "hslm_fwd_s8.py" or module_file_name(p) in imported for p in files)
    assert all(p.is_relative_to(ROOT / "hslm_ptx") and not p.is_relative_to(ROOT / "hslm_ptx" / "pipeline")
               for spec in KERNELS.values() for p in source_files(spec))


def module_file_name(path) -> str:
    """hslm_ptx/x/y.py -> hslm_ptx.x.y (a package's __init__.py -> the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_import_form_is_seen(tmp_path):
    module = tmp_path / "k.py"
    module.write_text("import numpy as np\nimport hslm_ptx.formats.ternary\nfrom hslm_ptx import tile, validate\n"
                      "from hslm_ptx.reference.testdata import pack\nfrom os import path\n"
                      "from hslm_ptx.tile import geometry, specs\nfrom hslm_ptx.tile.rule import split_k\n"
                      "def late():\n    from hslm_ptx.reference.quant import quantize_rows\n")
    # a package's submodule imported by name is a module of its own; a name from a module is not
    assert imported_modules(module) == {"hslm_ptx.formats.ternary", "hslm_ptx.tile", "hslm_ptx.validate", "hslm_ptx.reference.testdata",
                                        "hslm_ptx.tile.geometry", "hslm_ptx.tile.specs", "hslm_ptx.tile.rule",
                                        "hslm_ptx.reference.quant"}


def test_check_hash_covers_reference_and_inputs_not_the_emitter():
    spec = KERNELS["hslm_dx_s8"]
    base = check_hash(spec)
    assert check_hash(dataclasses.replace(spec, emit=lambda: "// other")) == base
    assert check_hash(dataclasses.replace(spec, reference=lambda d, i: 0)) != base
    assert check_hash(dataclasses.replace(spec, make_inputs=lambda d, rng: {})) != base
    by_module = {s.module: source_sha256(s) for s in KERNELS.values()}  # a family's configurations share a module
    assert len(set(by_module.values())) == len(by_module) >= 3
    assert all(source_sha256(s) == by_module[s.module] for s in KERNELS.values())


SCORING_FILES = {ROOT / "hslm_ptx" / "cost" / "model.py", ROOT / "hslm_ptx" / "tile" / "rule.py"}


def test_the_scoring_modules_are_in_a_kernels_source_but_not_its_verdict():
    spec = KERNELS["hslm_fwd_bf16"]
    assert SCORING_FILES <= set(source_files(spec))  # the seal and emit's file_dep still pin them
    assert not SCORING_FILES & set(closure(spec.module, SCORING))
    assert set(closure(spec.module, SCORING)) < set(closure(spec.module))


def edited_hash(monkeypatch, spec, path) -> str:
    """The verdict hash of ``spec`` as if ``path``'s code had changed."""
    real = sources.code_sha256
    monkeypatch.setattr(sources, "code_sha256", lambda p: "edited" if p == path else real(p))
    try:
        return computed_check_hash(spec)
    finally:
        monkeypatch.setattr(sources, "code_sha256", real)


def test_a_model_edit_leaves_every_verdict_hash_and_a_tile_edit_does_not(monkeypatch):
    """A cost-model or tile-rule edit changes a cell only through its launch (in the cell's
    inputs as data); an edit of a module the reference reads changes its verdict hash."""
    for name in ("hslm_fwd_bf16", "hslm_dw_splitk_f16", "hslm_grads_f32_bf16", "hslm_fwdx_bf16"):
        spec, base = KERNELS[name], computed_check_hash(KERNELS[name])
        assert all(edited_hash(monkeypatch, spec, path) == base for path in SCORING_FILES)
    spec = KERNELS["hslm_fwd_bf16"]
    assert edited_hash(monkeypatch, spec, ROOT / "hslm_ptx" / "reference" / "stepmath.py") != computed_check_hash(spec)


def kernel_copy(tmp_path, text: str):
    """A one-file stand-in kernel module: the closure of a module outside the package is its file."""
    path = tmp_path / "k.py"
    path.write_text(text)
    return path


KERNEL = '''"""A kernel."""
import numpy as np


def reference(d, inputs):
    """The product."""
    return inputs["x"] @ inputs["w"]  # exact in int64
'''


def test_docstring_or_comment_edits_leave_the_code_hash_alone(tmp_path):
    path = kernel_copy(tmp_path, KERNEL)
    base = code_sha256(path)
    edits = [KERNEL.replace('"""The product."""', '"""The product, said at length\n    over two lines."""'),
             KERNEL.replace("# exact in int64", "# exact: int64 never overflows here"),
             KERNEL.replace('"""A kernel."""\n', '"""A kernel.\n\nWith a longer module docstring."""\n# and a comment\n'),
             KERNEL.replace("    return", "\n    return")]  # a blank line: every later line number moves
    for text in edits:
        path.write_text(text)
        assert code_sha256(path) == base, text


def test_a_code_edit_changes_the_code_hash(tmp_path):
    """Negative: the normalisation keeps everything the code means, strings included."""
    path = kernel_copy(tmp_path, KERNEL)
    base = code_sha256(path)
    for text in (KERNEL.replace("@", "*"), KERNEL.replace('inputs["w"]', 'inputs["W"]'),
                 KERNEL.replace('    """The product."""\n', '    "The product."\n    x = "not a docstring"\n')):
        path.write_text(text)
        assert code_sha256(path) != base, text
    path.write_text(KERNEL)
    assert code_sha256(path) == base


def test_a_kernel_modules_docstring_edit_keeps_its_code_hash(tmp_path):
    """On a real kernel module (a copy): its module docstring reworded keeps the hash the
    seal's source hash is made of (path + code hash per file); a code edit does not."""
    text = (ROOT / "hslm_ptx" / "families" / "hslm_fwd_s8.py").read_text()
    path = kernel_copy(tmp_path, text)
    base = code_sha256(path)
    assert text.startswith('"""')
    path.write_text(text.replace('"""', '"""Reworded prose. ', 1))
    assert code_sha256(path) == base
    path.write_text(text + "\nEXTRA = 1\n")
    assert code_sha256(path) != base


def test_parses_are_kept_by_content(tmp_path, monkeypatch):
    """The parse memo is keyed by the file's bytes: an edit is parsed again, the old
    bytes' result stays for when they come back, and a new process reads what was kept."""
    from hslm_ptx.pipeline.core import sources
    from hslm_ptx.pipeline.core.files import sha256_file

    monkeypatch.setattr(sources, "MEMO", sources._Memo(tmp_path / "cache" / "memo.json"))
    module = tmp_path / "m.py"
    module.write_text("import hslm_ptx.kernel.spec\n")
    assert imported_modules(module) == {"hslm_ptx.kernel.spec"}
    first = sha256_file(module)
    module.write_text("import hslm_ptx.kernel.pitch\n")
    assert imported_modules(module) == {"hslm_ptx.kernel.pitch"}
    sources.MEMO.save()
    kept = sources._Memo(tmp_path / "cache" / "memo.json").get()  # what the next process starts from
    assert kept.imports[first] == ["hslm_ptx.kernel.spec"] and kept.imports[sha256_file(module)] == ["hslm_ptx.kernel.pitch"]


def test_an_unreadable_memo_is_recomputed(tmp_path, monkeypatch):
    from hslm_ptx.pipeline.core import sources

    (tmp_path / "memo.json").write_text('{"imports": {"x": "not a list"}}')
    monkeypatch.setattr(sources, "MEMO", sources._Memo(tmp_path / "memo.json"))
    assert sources.MEMO.get().imports == {}
    assert check_hash(KERNELS["hslm_fwd_s8"]) == sources.computed_check_hash(KERNELS["hslm_fwd_s8"])
