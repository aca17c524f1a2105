"""The records of the layer step's counts: what ``doit layer`` writes, what the ledger holds,
and what the layer rows of the bench write.

- :class:`LayerReport` (artifacts/layer/<set>.json): per shape, what one TernaryLinear
  step (weight preparation, forward, dX, dW, with bias) launches, synchronizes, copies,
  allocates outside torch's allocator and moves, counted on the recording stand-in
  (hslm_ptx.runtime.recording.RecordingRuntime), and the launch list.
- :class:`LayerLedger` (ledger/layer.json, committed): the level each count is held to per
  set and shape, and the source hash of the step code those levels were counted from
  (hslm_ptx.pipeline.ratchet.layer_ratchet judges and blesses it).
- :class:`LayerBenchReport`: the GPU timings of hslm_ptx.pipeline.bench.layer.

These models do not derive from hslm_ptx.pipeline.core.models, so hslm_ptx.pipeline.core.models may import them (a
ledger that holds the levels) without an import cycle; they follow the same rules:
unknown fields refused, immutable, a ``schema_version`` per file.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# the counts a step is judged on, in table order; each may fall but never silently rise
COUNTS: tuple[str, ...] = ("launches", "host_syncs", "h2d_copies", "foreign_allocations", "bytes_moved")


class LayerRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LayerLaunch(LayerRecord):
    """One launch of the step: the kernel (or a GPU operation that is not a step kernel,
    named ``<not a step kernel: ...>``), its geometry and the bytes of its buffers."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int = Field(ge=0)
    bytes: int = Field(ge=0, description="bytes of every buffer argument it reads or writes, once")


class LayerCounts(LayerRecord):
    """The ratcheted counts of one step (:data:`COUNTS`)."""

    launches: int = Field(ge=0)
    host_syncs: int = Field(ge=0)
    h2d_copies: int = Field(ge=0)
    foreign_allocations: int = Field(ge=0)
    bytes_moved: int = Field(ge=0, description="the DRAM-level floor: each launch's buffers once, not L2 traffic")


class LayerShape(LayerCounts):
    """One shape of a set: its counts, the bytes a step cannot avoid, the launch list, and
    where each host sync, h2d copy and foreign allocation happened (file:line)."""

    name: str
    R: int = Field(ge=1)
    K: int = Field(ge=1)
    N: int = Field(ge=1)
    dtype: str
    weight_dtype: str
    bias: bool
    bytes_minimum: int = Field(ge=0, description="x, W, bias, dY read once; y, dX, dW, db written once")
    first_step_launches: int = Field(ge=0, description="the first step's launches, one-time workspace fills included")
    kept_weight_launches: int = Field(0, ge=0, description="a training step on a weight version prepared before")
    inference_launches: int = Field(0, ge=0, description="a forward on a prepared weight, no gradient to come")
    launch_list: list[LayerLaunch]
    sync_sites: list[str] = []
    copy_sites: list[str] = []
    foreign_sites: list[str] = []

    @property
    def counts(self) -> LayerCounts:
        return LayerCounts(**{name: getattr(self, name) for name in COUNTS})


class LayerReport(LayerRecord):
    """artifacts/layer/<set>.json."""

    schema_version: Literal[1] = 1
    shape_set: str
    source_sha256: str = Field(description="the step code counted: hslm_ptx/step/launches.py and what it imports")
    shapes: list[LayerShape]


class LayerLevel(LayerRecord):
    """The ledger's level for one set and shape. A rise accepted with a reason keeps the
    level before it in ``rose_from`` until the counts are back at it."""

    shape_set: str
    shape: str
    level: LayerCounts
    reason: str | None = None
    rose_from: LayerCounts | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.shape_set, self.shape)


class LayerLedger(LayerRecord):
    """ledger/layer.json: the levels, sorted by (set, shape), and the step source they seal."""

    schema_version: Literal[1] = 1
    source_sha256: str
    levels: list[LayerLevel]


class LayerTiming(LayerRecord):
    """Device time of one step in microseconds over the samples (CUDA events)."""

    median_us: float
    p10_us: float
    p90_us: float
    samples: int = Field(ge=1)


class LayerBenchRow(LayerRecord):
    """One implementation on one shape: forward + backward, eager and graph-replayed."""

    shape: str
    R: int
    K: int
    N: int
    implementation: Literal["TernaryLinear", "nn.Linear"]
    dtype: str
    eager: LayerTiming | None = None
    graph: LayerTiming | None = None
    error: str | None = None  # one line when it could not run


class LayerBenchRatio(LayerRecord):
    """TernaryLinear's median step time over nn.Linear's on one shape (below 1: ours is faster)."""

    shape: str
    eager: float | None
    graph: float | None


class LayerBenchReport(LayerRecord):
    """What ``python -m hslm_ptx.pipeline.bench.layer`` writes."""

    schema_version: Literal[1] = 1
    kind: Literal["MEASURED"] = "MEASURED"
    created: str
    device: str
    torch_version: str
    budget_s: float
    rows: list[LayerBenchRow]
    ratios: list[LayerBenchRatio] = []
