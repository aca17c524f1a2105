"""What the gate says: a :class:`Finding` per problem (its kind, the cell or file, what is
wrong, the command or edit that clears it), judged by rules over one :class:`Inputs`."""
from __future__ import annotations

from typing import Literal, NamedTuple

from hslm_ptx.pipeline.core.models import AllowedDuplicates, Ledger, RunSummary, Seal
from hslm_ptx.pipeline.ratchet.stores import Snapshot

Kind = Literal["UNEXPECTED FAILURE", "UNEXPECTED PASS", "UNLISTED", "STALE", "OVER CAP",
               "BAD REASON", "STALE SEAL", "UNSEALED", "BAD SEAL", "SEAL MISMATCH", "DUPLICATE BODY",
               "SCHEMA DRIFT", "NOT RUN", "SLOWER", "FASTER", "MISSING", "ACCEPTED SLOWER", "LOOSENED",
               "ACCEPTED LOOSENING", "NEW KERNEL", "UNSOURCED", "NO GPU EVIDENCE"]
INFORMATIONAL: frozenset[str] = frozenset({"NOT RUN", "FASTER", "ACCEPTED SLOWER", "ACCEPTED LOOSENING",
                                           "NO GPU EVIDENCE"})
SHOWN_MISMATCHES = 8  # per seal; the rest are counted on one more line


class Finding(NamedTuple):
    kind: Kind
    subject: str  # the cell or the file
    what: str
    fix: str  # the command (or edit) that clears it

    @property
    def red(self) -> bool:
        return self.kind not in INFORMATIONAL

    def __str__(self) -> str:
        return f"{'' if self.red else 'INFO '}{self.kind}  {self.subject}: {self.what}  -> {self.fix}"


class Inputs(NamedTuple):
    run: RunSummary
    ledger: Ledger
    seals: dict[str, Seal]
    allowed: AllowedDuplicates
    base: Ledger | None = None  # the ledger at ``base=REF``, when given
    base_ref: str = ""
    stores: Snapshot | None = None  # the committed stores now (hslm_ptx.pipeline.ratchet.stores)
    base_stores: Snapshot | None = None  # and at ``base=REF``
    counted: tuple[tuple[str, str, str, str], ...] = ()  # what the judges that count afresh found (see gather)
