"""hslm_ptx.pipeline.tasks.graph: a run loads the stages it asks for and what they need, and each
stage's declared needs cover every task and target its tasks depend on."""
from __future__ import annotations

import pytest
from doit.loader import load_tasks

from hslm_ptx.pipeline.core.config import ROOT
from hslm_ptx.pipeline.tasks.graph import Node, asked_stages, creators, needed

DEFAULT = ["verify"]


def dodo_graph() -> tuple[Node, ...]:
    """dodo.py's GRAPH table: the file up to DOIT_CONFIG (importing it would run startup)."""
    head = (ROOT / "dodo.py").read_text().split("DOIT_CONFIG = {")[0]
    namespace: dict = {}
    exec(compile(head, str(ROOT / "dodo.py"), "exec"), namespace)
    return namespace["GRAPH"]


GRAPH = dodo_graph()


@pytest.mark.parametrize("argv, asked", [
    (["doit"], DEFAULT),
    (["/venv/bin/doit", "verify"], ["verify"]),
    (["doit", "-v", "2", "verify:hslm_fwd_s8", "shape=smoke"], ["verify"]),
    (["/usr/lib/python3/site-packages/doit/__main__.py", "-f", "dodo.py", "-d", ".", "run", "gate", "base=HEAD"],
     ["gate"]),
    (["doit", "--continue", "seal", "bless", "accept_new=1"], ["seal", "bless"]),
    (["doit", "artifacts/ptx/k.ptx"], ["artifacts/ptx/k.ptx"]),  # a target: not a stage
    (["doit", "list"], None), (["doit", "clean"], None), (["doit", "info", "verify"], None),
    (["doit", "forget", "verify"], None), (["doit", "help", "verify"], None),
    (["pytest", "verify"], None),  # not doit: everything
])
def test_a_command_line_asks_for_its_stages(argv, asked):
    assert asked_stages(argv, DEFAULT) == asked


def test_a_stage_comes_with_what_it_needs_and_nothing_else():
    assert [n.name for n in needed(GRAPH, ["verify"])] == ["emit", "ptxas", "verify"]
    assert {n.name for n in needed(GRAPH, ["gate"])} == {"emit", "ptxas", "verify", "sass", "kernel_tests", "gate"}
    assert [n.name for n in needed(GRAPH, ["report"])] == ["report"]


def test_a_run_of_verify_loads_three_creators_and_any_other_command_all():
    assert set(creators(GRAPH, DEFAULT, ["doit", "verify"])) == {"task_emit", "ptxas", "verify"}
    assert len(creators(GRAPH, DEFAULT, ["doit", "list"])) == len(GRAPH)
    assert len(creators(GRAPH, DEFAULT, ["doit", "nosuchstage"])) == len(GRAPH)  # doit says what is wrong


def tasks_of(nodes) -> dict:
    namespace = creators(nodes, DEFAULT, ["doit", "list"])  # every creator of ``nodes``
    return {task.name: task for task in load_tasks(namespace)}


def missing_needs(nodes, node: Node) -> list[str]:
    """What ``node``'s tasks, loaded with its needs alone, depend on but would not find
    (a task_dep) or would not rebuild (a file_dep that a task of the whole graph writes)."""
    everything = tasks_of(nodes)
    writer = {target: task.name for task in everything.values() for target in task.targets}
    alone = tasks_of([n for n in needed(nodes, [node.name])])
    written = {target for task in alone.values() for target in task.targets}
    found = []
    for task in alone.values():
        found += [f"{task.name}: task_dep {dep}" for dep in task.task_dep if dep not in alone]
        found += [f"{task.name}: file_dep {dep} (written by {writer[dep]})" for dep in sorted(task.file_dep)
                  if dep in writer and dep not in written]
    return found


@pytest.mark.parametrize("name", [node.name for node in GRAPH])
def test_each_stage_needs_what_its_tasks_depend_on(name):
    node = next(n for n in GRAPH if n.name == name)
    assert missing_needs(GRAPH, node) == []


def test_a_missing_need_is_found():
    dropped = tuple(n._replace(needs=("verify", "kernel_tests")) if n.name == "gate" else n for n in GRAPH)
    missing = missing_needs(dropped, next(n for n in dropped if n.name == "gate"))
    assert missing and all(line.startswith("gate: task_dep sass:") for line in missing)
    dropped = tuple(n._replace(needs=()) if n.name == "sass" else n for n in GRAPH)
    missing = missing_needs(dropped, next(n for n in dropped if n.name == "sass"))
    assert missing and all("file_dep" in line and "(written by emit:" in line for line in missing)
