"""GPU timing against cuBLAS and torch, its records, reports and landing."""
