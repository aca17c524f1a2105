r"""The task graph (`doit list`; `doit help <task>` for one task and its variables).

    emit -> ptxas -> verify --------------------> bench (GPU)   pipeline/stages/tasks_build.py, tasks_bench.py
              \-> sass ---------+--> model                     pipeline/stages/tasks_perf.py
                                \--> seal, bless <- kernel_tests   pipeline/stages/tasks_ratchet.py
    gate: emit, ptxas, sass, verify, kernel_tests, then judged against ledger/ and seals
    report: the last ptxas, verify and bench tables again
    layer: what one TernaryLinear step launches, syncs, copies, allocates, moves      pipeline/stages/tasks_layer.py

A stage (pipeline.stages.table.Stage: its cells, their task, its judge and its summary line) is
one line below; doit makes each into its task group. `doit verify` is the default; CI
runs `doit gate`.
"""
from pipeline.core.checker import ContentChecker
from pipeline.core.cmdline import startup
from pipeline.stages.reporter import StageReporter
from pipeline.stages.tasks_bench import task_bench  # noqa: F401
from pipeline.stages.tasks_build import task_emit, task_report  # noqa: F401
from pipeline.stages.tasks_perf import task_model, task_sass  # noqa: F401
from pipeline.stages.tasks_ratchet import task_bless, task_gate, task_kernel_tests, task_seal  # noqa: F401

# the stages: doit takes each as a task creator (its create_doit_tasks), named by the stage
from pipeline.stages.tasks_build import PTXAS  # noqa: F401,E402  ptxas:<kernel>, ptxas:check
from pipeline.stages.tasks_build import VERIFY  # noqa: F401,E402  verify:<kernel> (its cells inside), verify:check
from pipeline.stages.tasks_layer import LAYER  # noqa: F401,E402  layer:<set>

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
