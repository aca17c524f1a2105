"""What a kernel declares: its KernelSpec (parameters, layouts, launch geometry, reference) and the
pitched activation layouts its parameters use."""
