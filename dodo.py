r"""The task graph (`doit list`; `doit help <task>` for one task and its variables).

    emit -> ptxas -> verify --------------------> bench (GPU)   pipeline/stages/tasks_build.py, tasks_bench.py
              \-> sass ---------+--> model                     pipeline/stages/tasks_perf.py
                                \--> seal, bless <- kernel_tests   pipeline/stages/tasks_ratchet.py
    gate: emit, ptxas, sass, verify, kernel_tests, then judged against ledger/ and seals
    report: the last ptxas, verify and bench tables again
    layer: what one TernaryLinear step launches, syncs, copies, allocates, moves      pipeline/stages/tasks_layer.py

Each line of GRAPH is one stage: its task group, its creator, and the stages its tasks
depend on. A run loads the stages it asks for and what they need, nothing else
(pipeline.stages.graph), so `doit verify` never imports the bench or the perf model.
`doit verify` is the default; CI runs `doit gate`.
"""
from pipeline.core.checker import ContentChecker
from pipeline.core.cmdline import startup
from pipeline.stages.graph import Node, creators
from pipeline.stages.reporter import StageReporter

GRAPH = (
    Node("emit", "pipeline.stages.tasks_build:task_emit"),
    Node("ptxas", "pipeline.stages.tasks_build:PTXAS", needs=("emit",)),  # ptxas:<kernel>, ptxas:check
    Node("verify", "pipeline.stages.tasks_build:VERIFY", needs=("ptxas",)),  # verify:<kernel> (its cells inside), verify:check
    Node("sass", "pipeline.stages.tasks_perf:task_sass", needs=("emit",)),
    Node("model", "pipeline.stages.tasks_perf:task_model", needs=("sass", "verify")),
    Node("bench", "pipeline.stages.tasks_bench:task_bench", needs=("emit",)),
    Node("layer", "pipeline.stages.tasks_layer:LAYER"),  # layer:<set>
    Node("kernel_tests", "pipeline.stages.tasks_ratchet:task_kernel_tests"),
    Node("seal", "pipeline.stages.tasks_ratchet:task_seal", needs=("verify", "sass", "kernel_tests")),
    Node("bless", "pipeline.stages.tasks_ratchet:task_bless"),
    Node("gate", "pipeline.stages.tasks_ratchet:task_gate", needs=("verify", "sass", "kernel_tests")),
    Node("report", "pipeline.stages.tasks_build:task_report"),
)

DOIT_CONFIG = {
    "default_tasks": ["verify"],
    "check_file_uptodate": ContentChecker,  # inputs by sha256, never by mtime
    "dep_file": ".doit.db",
    "backend": "sqlite3",
    "verbosity": 2,
    "reporter": StageReporter,  # one line per stage for what was up to date
    "cleanall": True,  # `doit clean` removes everything the graph writes
}

startup()  # refuse unknown name=value variables, sweep a killed run's temp files
globals().update(creators(GRAPH, DOIT_CONFIG["default_tasks"]))  # the stages this command line needs
