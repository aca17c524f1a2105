"""The task graph (`doit list`; `doit help <task>` for one task and its variables).

    emit -> ptxas -> verify -> bench          (pipeline/tasks_build.py, tasks_bench.py)
                      \\-> kernel_tests -> seal, bless, gate   (pipeline/tasks_ratchet.py)

`doit gate` (CI) depends on emit, ptxas, sass, verify and kernel_tests and then judges their
evidence against ledger/ledger.json and ledger/seals/; `doit verify` is the default.
"""
from pipeline.cmdline import startup
from pipeline.tasks_build import DOIT_CONFIG, task_emit, task_ptxas, task_verify  # noqa: F401
from pipeline.tasks_bench import task_bench  # noqa: F401
from pipeline.tasks_ratchet import task_bless, task_gate, task_kernel_tests, task_seal  # noqa: F401
from pipeline.tasks_perf import task_sass, task_model  # noqa: F401

startup()  # refuse unknown name=value variables, sweep a killed run's temp files
