"""The tests that skip without CUDA, found in their files and run on the GPU machine.

    python3 tools/cuda_tests.py list FILE ...      (their pytest node ids, one a line)
    python3 tools/cuda_tests.py run FILE ...       (pytest on them; a skip counts as a failure)

A test module says a test needs CUDA in one of three ways, each found in its syntax tree
(nothing is imported, so listing needs no torch): a ``pytest.mark.gpu`` mark or a
``skipif`` whose condition mentions CUDA (or calls a function that asks
``cuda.is_available``); a call, in the test's body, of a function that skips when
``cuda.is_available()`` is false (defined in the module, or imported from a helper
module beside it); or an ``if`` in the body on ``cuda.is_available``
that calls ``pytest.skip``. Running the whole files instead would spend the GPU session's
minutes on the CPU tests CI already runs. On the GPU machine a CUDA test that skips is
no evidence, so ``run`` exits 1 when any of them skipped, failed or errored, and 2 when
the files name none (one line each). Its last line counts them.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli  # noqa: E402
from hslm_ptx.pipeline.core.errors import UserError  # noqa: E402

AVAILABLE = "cuda.is_available"



def _text(source: str, node: ast.AST) -> str:
    return ast.get_source_segment(source, node) or ""


def _calls(node: ast.AST) -> set[str]:
    """The plain names called anywhere inside ``node``."""
    return {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def _skips_inline(source: str, fn: ast.FunctionDef) -> bool:
    """An ``if`` on ``cuda.is_available`` whose body calls ``pytest.skip``."""
    return any(isinstance(n, ast.If) and AVAILABLE in _text(source, n.test)
               and any("skip" in _text(source, s) for s in n.body) for n in ast.walk(fn))


def _guards(source: str, functions: list[ast.FunctionDef]) -> tuple[set[str], set[str]]:
    """(the functions that ask ``cuda.is_available``, e.g. _cuda_ready; those of them that
    skip on it, e.g. cuda_or_skip)."""
    asks = {f.name for f in functions if AVAILABLE in _text(source, f)}
    return asks, {f.name for f in functions if f.name in asks and _skips_inline(source, f)}


def cuda_tests(path: Path) -> list[str]:
    """The node ids (``path::name``) of the module's tests that skip without CUDA."""
    try:
        source = path.read_text()
        tree = ast.parse(source, filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot be read as Python ({type(exc).__name__}: {exc}); "
                        "give the test files whose CUDA tests to run") from None
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    asks, skippers = _guards(source, functions)
    for node in tree.body:  # guards imported from a helper module beside the test file
        helper = path.parent / f"{getattr(node, 'module', None) or ''}.py"
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and helper.is_file():
            theirs = ast.parse(helper.read_text(), filename=str(helper))
            their_asks, their_skippers = _guards(helper.read_text(), [n for n in theirs.body
                                                                    if isinstance(n, ast.FunctionDef)])
            for alias in node.names:
                if alias.name in their_asks:
                    asks.add(alias.asname or alias.name)
                if alias.name in their_skippers:
                    skippers.add(alias.asname or alias.name)
    found = []
    for fn in functions:
        if not fn.name.startswith("test"):
            continue
        marks = [_text(source, d) for d in fn.decorator_list]
        marked = any("mark.gpu" in m or ("skipif" in m and ("cuda" in m.lower() or any(a in m for a in asks)))
                     for m in marks)
        if marked or _calls(fn) & skippers or _skips_inline(source, fn):
            found.append(f"{path}::{fn.name}")
    return found


class SkipCounter:
    """A pytest plugin: each test's outcome, counted once (setup skips and call failures)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001 (pytest's TestReport)
        if report.skipped:
            self.outcomes[report.nodeid] = "skipped"
        elif report.failed:
            self.outcomes[report.nodeid] = "failed"
        elif report.when == "call":
            self.outcomes.setdefault(report.nodeid, "passed")


def given_order(files: list[Path]) -> object:
    """A pytest plugin: the tests run in the order of the files given (after the project's
    conftest has sorted them its own way), so the layer step's cases run before a cold
    torch.compile and a step cut off at its cap has lost the slowest case only."""
    import pytest  # only when running: listing needs no pytest

    given = [Path(f).resolve() for f in files]

    class GivenOrder:
        @pytest.hookimpl(trylast=True)
        def pytest_collection_modifyitems(self, items: list) -> None:  # noqa: ANN001 (pytest's Items)
            def rank(item) -> int:  # noqa: ANN001
                path = Path(item.path).resolve()
                return given.index(path) if path in given else len(given)

            items.sort(key=rank)  # stable: each file's own order kept

    return GivenOrder()


def parser() -> OneLineParser:
    p = OneLineParser(prog="python3 tools/cuda_tests.py",
                      description="List or run the tests that skip without CUDA.")
    p.add_argument("command", choices=("list", "run"))
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="test modules")
    return p


def main(argv: list[str]) -> int:
    opts = parser().parse_args(argv)
    missing = [f for f in opts.files if not f.is_file()]
    if missing:
        raise UserError(f"{missing[0]}: no such test file; give test modules (e.g. tests/test_torch_linear.py)")
    ids = [node for f in opts.files for node in cuda_tests(f)]
    if opts.command == "list":
        print("\n".join(ids))
        return 0
    if not ids:
        print(f"no test in {' '.join(map(str, opts.files))} skips without CUDA: nothing to run", flush=True)
        return 2
    import pytest  # the GPU machine gets it from the carried wheels

    counter = SkipCounter()
    # -vv: one line per test as it ends (the project's addopts say -q), the partial evidence of a cut-off run
    status = pytest.main(["-p", "no:cacheprovider", "-vv", "-rs", *ids], plugins=[counter, given_order(opts.files)])
    counts = {k: sum(v == k for v in counter.outcomes.values()) for k in ("passed", "failed", "skipped")}
    print(f"{len(counter.outcomes)} CUDA tests: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped" + (" (a CUDA test skipped on the GPU machine is no evidence)"
                                            if counts["skipped"] else ""), flush=True)
    return 1 if status != 0 or counts["skipped"] or counts["failed"] or not counter.outcomes else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
