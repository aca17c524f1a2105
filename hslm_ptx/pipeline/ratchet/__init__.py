"""Seals, the ledger and the gate: what a run is judged against."""
