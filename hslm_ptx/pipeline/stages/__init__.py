"""The doit stages: the work each one does and the task creators that wire it."""
