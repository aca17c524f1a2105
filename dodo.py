"""The build graph: emit -> ptxas -> verify (`doit list` shows the tasks).

Temporary dodo written by the build helper; the lead owns the final one.
"""
from pipeline.tasks_build import DOIT_CONFIG, task_emit, task_ptxas, task_verify  # noqa: F401
from pipeline.tasks_bench import task_bench  # noqa: F401
from pipeline.tasks_ratchet import task_bless, task_gate, task_kernel_tests, task_seal  # noqa: F401
from pipeline.tasks_perf import task_sass, task_model  # noqa: F401
