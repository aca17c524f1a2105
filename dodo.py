r"""The task graph (`doit list`; `doit help <task>` for one task and its variables).

    emit -> ptxas -> verify --------------------> bench (GPU)   hslm_ptx/pipeline/tasks/build.py, tasks_bench.py
              \-> sass ---------+--> model                     hslm_ptx/pipeline/tasks/perf.py
                                \--> seal, bless <- kernel_tests   hslm_ptx/pipeline/tasks/ratchet.py
    gate: emit, ptxas, sass, verify, kernel_tests, then judged against ledger/ and seals
    report: the last ptxas, verify and bench tables again
    layer: what one TernaryLinear step launches, syncs, copies, allocates, moves      hslm_ptx/pipeline/tasks/layer.py

Each line of GRAPH is one stage: its task group, its creator, and the stages its tasks
depend on. A run loads the stages it asks for and what they need, nothing else
(hslm_ptx.pipeline.tasks.graph), so `doit verify` never imports the bench or the perf model.
`doit verify` is the default; CI runs `doit gate`.
"""
from hslm_ptx.pipeline.core.checker import ContentChecker
from hslm_ptx.pipeline.core.cmdline import startup
from hslm_ptx.pipeline.tasks.graph import Node, creators
from hslm_ptx.pipeline.tasks.reporter import StageReporter

GRAPH = (
    Node("emit", "hslm_ptx.pipeline.tasks.build:task_emit"),
    Node("ptxas", "hslm_ptx.pipeline.tasks.build:PTXAS", needs=("emit",)),  # ptxas:<kernel>, ptxas:check
    Node("verify", "hslm_ptx.pipeline.tasks.build:VERIFY", needs=("ptxas",)),  # verify:<kernel> (its cells inside), verify:check
    Node("sass", "hslm_ptx.pipeline.tasks.perf:task_sass", needs=("emit",)),
    Node("model", "hslm_ptx.pipeline.tasks.perf:task_model", needs=("sass", "verify")),
    Node("bench", "hslm_ptx.pipeline.tasks.bench:task_bench", needs=("emit",)),
    Node("layer", "hslm_ptx.pipeline.tasks.layer:LAYER"),  # layer:<set>
    Node("kernel_tests", "hslm_ptx.pipeline.tasks.ratchet:task_kernel_tests"),
    Node("seal", "hslm_ptx.pipeline.tasks.ratchet:task_seal", needs=("verify", "sass", "kernel_tests")),
    Node("bless", "hslm_ptx.pipeline.tasks.ratchet:task_bless"),
    Node("gate", "hslm_ptx.pipeline.tasks.ratchet:task_gate", needs=("verify", "sass", "kernel_tests")),
    Node("report", "hslm_ptx.pipeline.tasks.build:task_report"),
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
