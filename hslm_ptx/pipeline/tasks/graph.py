"""The stages as dodo.py lists them, and which of them one doit command line loads.

doit calls every task creator of a dodo before it runs a task, and a creator imports
what its tasks need (the kernels, numpy, pydantic, the perf model). A run loads only
the stages it asks for and the stages their tasks depend on (:attr:`Node.needs`), so
``doit verify`` creates emit, ptxas and verify and nothing else. Every other command
(``doit list``, ``info``, ``clean``, ``forget``, ...) and any name that is not a stage
(a target file, a misspelling doit then reports) loads them all.

``needs`` is what keeps this exact: a stage's tasks may name another stage's tasks
(``task_dep``) or read its targets (``file_dep``, which doit turns into a dependency
only when the producing task exists). tests/test_stage_graph.py loads each stage with
its needs alone and checks both against the whole graph.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import NamedTuple, Sequence


class Node(NamedTuple):
    """One line of dodo.py: a stage, where its creator lives, what its tasks depend on."""

    name: str  # the task group (`doit <name>`)
    creator: str  # "module:attribute": a ``task_*`` function or a Stage
    needs: tuple[str, ...] = ()  # the stages whose tasks or targets its tasks depend on


def needed(nodes: Sequence[Node], asked: Sequence[str]) -> list[Node]:
    """The asked stages and, transitively, what they need, in the order listed."""
    by_name = {node.name: node for node in nodes}
    wanted: set[str] = set()
    todo = list(asked)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(by_name[name].needs)
    return [node for node in nodes if node.name in wanted]


def asked_stages(argv: Sequence[str], default: Sequence[str]) -> list[str] | None:
    """The stages a doit command line runs (``default`` when it names no task), or None when
    it is not a run of stages: another command, or a name that is not a stage's.

    The line is split with doit's own parser and the ``run`` command's options, as doit
    will split it, so ``doit -v 2 verify:k shape=smoke`` asks for ``verify``."""
    if not argv or not _is_doit(argv[0]):
        return None
    from doit.cmd_base import DodoTaskLoader
    from doit.cmd_run import Run
    from doit.cmdparse import CmdOption, CmdParse, CmdParseError
    from doit.doit_cmd import DoitMain

    args = list(argv[1:])
    try:  # as DoitMain.run: the loader's options (-f, -d, ...) may come before the command
        _, args = CmdParse([CmdOption(option) for option in DodoTaskLoader.cmd_options]).parse_only(args)
    except CmdParseError:
        pass
    args = [arg for arg in args if arg.startswith("-") or "=" not in arg]  # name=value: doit's variables
    if args and args[0] in {cmd.get_name() for cmd in DoitMain.DOIT_CMDS} | {"--help", "--version"}:
        if args.pop(0) != Run.get_name():
            return None
    options = Run.base_options + DodoTaskLoader.cmd_options + Run.cmd_options
    try:
        _, names = CmdParse([CmdOption(option) for option in options]).parse(args)
    except CmdParseError:  # doit will say what is wrong with the line; load everything for it
        return None
    return [name.split(":", 1)[0] for name in names] or list(default)


def _is_doit(program: str) -> bool:
    path = Path(program)
    return path.name == "doit" or (path.name == "__main__.py" and path.parent.name == "doit")


def creators(nodes: Sequence[Node], default: Sequence[str], argv: Sequence[str] | None = None) -> dict[str, object]:
    """The task creators this command line loads, named as doit finds them in a dodo's
    namespace: ``task_<name>`` for a function, the node's name for a Stage."""
    asked = asked_stages(sys.argv if argv is None else argv, default)
    known = {node.name for node in nodes}
    chosen = needed(nodes, asked) if asked is not None and set(asked) <= known else list(nodes)
    found = {}
    for node in chosen:
        module, attribute = node.creator.split(":")
        creator = getattr(importlib.import_module(module), attribute)
        found[f"task_{node.name}" if callable(creator) and not hasattr(creator, "create_doit_tasks") else node.name] = creator
    return found
