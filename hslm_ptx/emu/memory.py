"""Global and shared memory of one launch, with the checks real hardware does not make.

Every access arrives as a batch: one address per executing thread plus those threads'
global indices (for the error message). Addresses are checked for bounds and for
alignment to the whole access (a .v4.b32 needs 16), then served through a typed view
of the underlying bytes, so a batch is one numpy gather or scatter.

Global: buffer ``i`` (in argument order among the array arguments) lives in the 4 GiB
window from ``(i + 1) << 32``, so an address names its buffer without ambiguity and any
byte outside a buffer is out of bounds. Inside its window a buffer starts at its byte
offset within the allocation it views, modulo 256 (:func:`allocation_offset`): a fresh
array stands for a ``cudaMalloc``/CuPy allocation, which is 256-byte aligned, and a view
keeps its offset, so alignment is checked on the address as the hardware checks it
(PTX ISA 9.7.9.8 ld, 9.7.9.10 st: the address must be aligned to the access size) and a 16-byte load
through a view at offset 1 faults. Stores write the caller's array in place.

Global stores of one launch from different CTAs to the same byte are a ``race``: CTAs
are not ordered, so which value survives is up to the hardware. Atomics (atom, red) do
not take part: adding into one word from many CTAs is what they are for. A CTA loading
bytes another CTA stored (or storing bytes another CTA loaded) is a race too, unless a
release (stores, gpu fence, atomic) and a later acquire (atomic, gpu fence) order them:
see ``GlobalMemory``. So are lanes of one store writing different values to the same
bytes, a write to the source of a cp.async in flight, and any write into a read-only
array (``read_only``).

Shared: one window of ``size`` bytes per CTA, addressed by offset from 0. Race
tracking keeps, per byte (grain), the last writer and the readers tagged with the CTA's
barrier epoch (bar.sync bumps the epoch instead of clearing arrays): a byte touched by
two different threads since the last bar.sync, at least one of them writing, is a race.
A read of a shared byte no thread ever wrote is an ``uninitialized`` error (hardware
gives garbage there), unless the module was built with ``strict_shared_init=False``.
Bytes an asynchronous copy (cp.async, ``async_copy.py``) will write are ``pending``
until the issuing thread waits for its group: any access to them before is a race.
Loads are recorded lazily: a store checks only the loads whose window offsets overlap
its own (a copy ring refills one stage while the warps read another), and loads whose
CTAs have all passed a barrier since are dropped unrecorded.
"""
from __future__ import annotations

import numpy as np

SPAN = 1 << 32          # each global buffer owns a 4 GiB window of fake addresses
ALLOCATION_ALIGN = 256  # cudaMalloc and CuPy's pool return 256-byte aligned memory
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_TID_BITS = 11          # tags are (epoch << 11) | linear tid; a CTA has <= 1024 threads
DEFERRED_READS = 64     # shared loads kept unfolded across barriers of some CTAs


class Fault(Exception):
    """A per-thread failure found while executing; the machine adds line and thread."""

    def __init__(self, kind: str, thread: int, detail: str = "", address: int | None = None,
                 other: int | None = None):
        super().__init__(kind)
        self.kind, self.thread, self.detail = kind, int(thread), detail
        self.address = None if address is None else int(address)
        self.other = None if other is None else int(other)  # the racing thread


def span_of(offsets: np.ndarray, size: int) -> tuple[int, int]:
    """The window [lo, hi) that ``size``-byte accesses at ``offsets`` lie in; (0, 0), which
    overlaps nothing, for no access."""
    return (int(offsets.min()), int(offsets.max()) + size) if offsets.size else (0, 0)


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether the offset ranges [lo, hi) share a byte (an empty range shares none)."""
    return a[0] < b[1] and b[0] < a[1] and a[0] < a[1] and b[0] < b[1]


_ITEM = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
         8: np.dtype(np.uint64)}


def _items(a: np.ndarray) -> np.ndarray:
    """A C-contiguous [n, k] array as n items of one row each (an unsigned integer or a
    void of the row's bytes): numpy moves a 1-D item array in one pass, while indexing
    rows of a 2-D array costs several times as much."""
    nb = a.shape[1] * a.itemsize
    return a.view(_ITEM.get(nb) or np.dtype((np.void, nb)))[:, 0]


def take(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``a[rows]`` for a C-contiguous [n, k] array."""
    return _items(a)[rows].view(a.dtype).reshape(rows.size, a.shape[1])


def put(a: np.ndarray, rows: np.ndarray, values) -> None:
    """``a[rows] = values`` for a C-contiguous [n, k] array (``values``: [len(rows), k],
    [len(rows), 1] or a scalar, broadcast along the row as numpy would)."""
    v = np.asarray(values, a.dtype)
    if v.ndim == 2 and v.shape == (rows.size, 1) and a.shape[1] > 1:
        v = np.broadcast_to(v, (rows.size, a.shape[1]))
    if v.ndim == 2 and v.shape == (rows.size, a.shape[1]):
        _items(a)[rows] = np.ascontiguousarray(v).view(_items(a).dtype)[:, 0]
        return
    if v.ndim == 0 or v.size == 1:
        row = np.full((1, a.shape[1]), v.reshape(()), a.dtype)
        _items(a)[rows] = row.view(_items(a).dtype)[0, 0]
        return
    a[rows] = v


def distinct(rows: np.ndarray, mark: np.ndarray) -> bool:
    """Whether no two entries of ``rows`` are equal, without sorting: each entry writes
    its position into the scratch ``mark`` (one slot per possible row) and reads it back;
    of entries sharing a row only the last finds its own. Increasing rows (the common
    case) need no scratch at all. The sort that names the pair runs only when this fails."""
    if rows.size < 2 or bool((rows[1:] > rows[:-1]).all()):
        return True
    order = np.arange(rows.size, dtype=np.int32)
    mark[rows] = order
    return bool((mark[rows] == order).all())


def _first(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad)[0])


def _typed(raw: np.ndarray, elem: int, vec: int) -> np.ndarray:
    """The largest prefix of ``raw`` (uint8) viewed as [n, vec] elements of ``elem`` bytes.

    An access of ``elem*vec`` bytes that is aligned and in bounds always lies inside
    this prefix, so row ``offset // (elem*vec)`` is exactly the accessed data.
    """
    size = elem * vec
    n = raw.size // size * size
    return raw[:n].view(UINT[elem]).reshape(-1, vec)


def allocation_offset(a: np.ndarray) -> int:
    """Where ``a``'s data starts in the allocation it views, modulo 256: its address
    minus that of the array owning the memory (0 for an array that owns its data)."""
    owner = a
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    return (a.__array_interface__["data"][0]
            - owner.__array_interface__["data"][0]) % ALLOCATION_ALIGN


class GlobalMemory:
    """The launch's array arguments, reachable by fake 64-bit addresses.

    ``ctas``: the CTA of each thread index, to catch the races between CTAs (None for a
    one-CTA launch, where there is nothing to catch); ``grid`` names them.
    ``grain``: the smallest global store of the kernel. Every access is aligned to its
    size on the absolute address, so two accesses share a byte exactly when they share a
    ``grain``-aligned cell (a narrower load lies inside one cell), and the CTAs are
    tracked per cell: which CTA stored it and when, which CTA read it (``MANY``: more
    than one) and when. "When" is the launch's synchronisation clock (:meth:`fence`,
    :meth:`atomic`): a CTA's stores before a gpu-scope fence are *released* by its next
    atomic, and a CTA that executed an atomic later in the emulator's atomic order
    (instruction order, then thread order) and then a gpu-scope fence has *acquired*
    them: only then may it read them (or overwrite what the releasing CTA read)."""

    MANY = -2           # read_by: read by more than one CTA

    def __init__(self, buffers: list[tuple[str, np.ndarray]], ctas: np.ndarray | None = None,
                 grid: tuple[int, int, int] = (1, 1, 1), grain: int = 1):
        self.names = [n for n, _ in buffers]
        self.raw = [a.reshape(-1).view(np.uint8) for _, a in buffers]
        self.writeable = [bool(a.flags.writeable) for _, a in buffers]
        self.nbytes = np.array([r.size for r in self.raw] + [0], dtype=np.int64)
        self.start = np.array([allocation_offset(a) for _, a in buffers] + [0], dtype=np.int64)
        self.ctas, self.grid, self.grain = ctas, grid, grain
        self.copies = None          # the launch's in-flight cp.async book (async_copy.py)
        self.stored: dict[int, np.ndarray] = {}     # buffer -> CTA that stored each cell
        self.stored_at: dict[int, np.ndarray] = {}  # buffer -> clock of that store
        self.read_by: dict[int, np.ndarray] = {}    # buffer -> CTA that read each cell
        self.read_at: dict[int, np.ndarray] = {}    # buffer -> clock of the latest read
        self._views: dict[tuple[int, int, int], np.ndarray] = {}
        self._marks: dict[tuple, np.ndarray] = {}   # scratch of distinct()
        n = 0 if ctas is None else int(ctas[-1]) + 1
        self.clock = 1
        self.fenced = np.zeros(n, np.int64)         # clock of the CTA's last gpu fence
        self.released = np.zeros(n, np.int64)       # what its release covers: clock < this
        self.release_at = np.full(n, np.iinfo(np.int64).max, np.int64)  # its release's order
        self.atomic_at = np.zeros(n, np.int64)      # order of the CTA's latest atomic
        self.acquired = np.zeros(n, np.int64)       # releases ordered before this are seen

    @staticmethod
    def base(i: int, start: int = 0) -> int:
        """The fake address of buffer ``i`` whose data starts ``start`` bytes into an
        aligned allocation."""
        return (i + 1) * SPAN + start

    def _view(self, b: int, elem: int, vec: int) -> np.ndarray:
        """Buffer ``b`` as [n, vec] elements from its first ``elem*vec``-aligned byte."""
        key = (b, elem, vec)
        if key not in self._views:
            lead = -int(self.start[b]) % (elem * vec)
            self._views[key] = _typed(self.raw[b][lead:], elem, vec)
        return self._views[key]

    def words(self, b: int) -> np.ndarray:
        """Buffer ``b`` as u32 words (for atomics, which update it in place)."""
        return self._view(b, 4, 1)[:, 0]

    def locate(self, addr: np.ndarray, threads: np.ndarray, size: int):
        """Check a batch; return [(buffer, positions or slice, row index)], rows of
        ``_view(buffer, ...)`` for accesses of ``size`` bytes."""
        nb = len(self.raw)
        b = (addr >> np.uint64(32)).astype(np.int64) - 1
        off = (addr & np.uint64(SPAN - 1)).astype(np.int64)
        lo, hi = int(b.min()), int(b.max())
        if lo == hi and 0 <= lo < nb:
            off = off - self.start[lo]
            bad = (off < 0) | (off > self.nbytes[lo] - size)
            groups = [(lo, slice(None))]
        else:
            bi = np.where((b >= 0) & (b < nb), b, nb)
            off = off - self.start[bi]
            bad = (off < 0) | (off > self.nbytes[bi] - size)
            groups = [(k, np.flatnonzero(bi == k)) for k in range(nb)]
        if bad.any():
            i = _first(bad)
            k = int(b[i])
            where = (f"buffer {k} '{self.names[k]}' has {self.nbytes[k]} bytes"
                     if 0 <= k < nb else "not inside any buffer argument")
            raise Fault("out_of_bounds", threads[i], f"{size}-byte access, {where}",
                        int(addr[i]))
        mis = (addr & np.uint64(size - 1)) != 0
        if mis.any():
            i = _first(mis)
            k = int(b[i])
            raise Fault("misaligned", threads[i], f"{size}-byte access needs {size}-byte "
                        f"alignment; buffer {k} '{self.names[k]}' starts {self.start[k]} "
                        f"bytes past a {ALLOCATION_ALIGN}-byte boundary", int(addr[i]))
        shift = size.bit_length() - 1       # sizes are powers of two; off - lead >= 0 here
        return [(k, pos, (off[pos] - (-int(self.start[k]) % size)) >> shift)
                for k, pos in groups if isinstance(pos, slice) or pos.size]

    def load(self, addr, threads, elem: int, vec: int) -> np.ndarray:
        size = elem * vec
        groups = self.locate(addr, threads, size)
        if self.ctas is not None:
            for k, pos, _ in groups:
                self._note_read(k, threads[pos], size, addr[pos])
        if len(groups) == 1:
            k, _, rows = groups[0]
            return take(self._view(k, elem, vec), rows)
        out = np.empty((addr.size, vec), UINT[elem])
        for k, pos, rows in groups:
            out[pos] = take(self._view(k, elem, vec), rows)
        return out

    def store(self, addr, threads, elem: int, vec: int, values: np.ndarray) -> None:
        size = elem * vec
        for k, pos, rows in self.locate(addr, threads, size):
            self.writing(k, threads[pos], size, addr[pos])
            if self.ctas is not None:
                self._claim(k, threads[pos], size, addr[pos])
            if not distinct(rows, self._mark(("row", k, size), self._view(k, elem, vec).shape[0])):
                self._same_word(k, rows, values[pos], threads[pos], addr[pos])
            put(self._view(k, elem, vec), rows, values[pos])

    # ---- the checks ---------------------------------------------------------------------

    def _cells(self, size: int, threads: np.ndarray, addr: np.ndarray):
        """(cell, CTA) of every ``grain`` cell the accesses touch, in access order."""
        first = (addr & np.uint64(SPAN - 1)).astype(np.int64) >> (self.grain.bit_length() - 1)
        n = max(1, size // self.grain)
        if n == 1:
            return first, self.ctas[threads]
        return (first[:, None] + np.arange(n)).ravel(), np.repeat(self.ctas[threads], n)

    def _mark(self, key, n: int) -> np.ndarray:
        """The scratch of :func:`distinct` for ``n`` rows (kept: allocated once)."""
        mark = self._marks.get(key)
        if mark is None:
            mark = self._marks[key] = np.empty(n, np.int32)
        return mark

    def _table(self, book: dict, k: int, fill: int, dtype=np.int32) -> np.ndarray:
        if k not in book:
            book[k] = np.full((self.raw[k].size + int(self.start[k])) // self.grain + 1, fill,
                              dtype)
        return book[k]

    def writing(self, k: int, threads: np.ndarray, size: int, addr: np.ndarray) -> None:
        """Checks of every write (store or atomic) into buffer ``k``: the array is
        writeable, and no cp.async still in flight reads the bytes."""
        if not self.writeable[k]:
            raise Fault("read_only", threads[0], f"store into buffer {k} '{self.names[k]}', "
                        "a read-only numpy array (pass a writeable array)", int(addr[0]))
        if self.copies is not None and self.copies.copies:
            self._not_in_flight(k, threads, size, addr)

    def _not_in_flight(self, k: int, threads, size: int, addr) -> None:
        """A write to the source bytes of a cp.async its thread has not waited for is a
        race: the copy may read the bytes any time until then (PTX ISA 9.7.9.25)."""
        window = (addr & np.uint64(SPAN - 1)).astype(np.int64)
        lo, hi = window // self.grain, (window + size - 1) // self.grain
        busy = np.zeros((self.raw[k].size + int(self.start[k])) // self.grain + 1, bool)
        for c in self.copies.copies:
            mine = ((c.source >> np.uint64(32)).astype(np.int64) - 1 == k) & (c.have > 0)
            if not mine.any():
                continue
            src = (c.source[mine] & np.uint64(SPAN - 1)).astype(np.int64)
            first, last = src // self.grain, (src + c.have[mine] - 1) // self.grain
            for j in range(int((last - first).max()) + 1):
                busy[np.minimum(first + j, last)] = True
        hit = np.zeros(lo.size, bool)
        for j in range((size - 1) // self.grain + 1):
            hit |= busy[np.minimum(lo + j, hi)]
        if hit.any():
            i = _first(hit)
            raise Fault("race", threads[i], f"global store to buffer {k} '{self.names[k]}' "
                        "at the source of a cp.async its thread has not waited for "
                        "(cp.async.wait_group)", int(addr[i]))

    def _same_word(self, k: int, rows, values, threads, addr) -> None:
        """Lanes of one st.global that store different values into the same bytes: which
        one lands is up to the hardware (the same value from every lane is fine)."""
        order = np.argsort(rows, kind="stable")
        same = rows[order][1:] == rows[order][:-1]
        v = values.reshape(rows.size, -1)[order]
        differ = same & (v[1:] != v[:-1]).any(1)
        if differ.any():
            j = _first(differ)
            a, b = order[j], order[j + 1]
            raise Fault("race", threads[max(a, b)], f"global store to buffer {k} "
                        f"'{self.names[k]}': two threads of one instruction store different "
                        "values to the same bytes", int(addr[a]), other=threads[min(a, b)])

    def _ordered(self, writer: np.ndarray, at: np.ndarray, reader: np.ndarray) -> np.ndarray:
        """Whether CTA ``reader`` has acquired what CTA ``writer`` did at clock ``at``
        (``writer`` MANY: every CTA of the launch must have released it)."""
        many = writer == self.MANY
        w = np.where(many, 0, writer)
        cover = np.where(many, self.released.min(), self.released[w])
        order = np.where(many, self.release_at.max(), self.release_at[w])
        return (at < cover) & (order < self.acquired[reader])

    def _note_read(self, k: int, threads, size: int, addr) -> None:
        """A load of buffer ``k``: a cell another CTA stored is a race unless ordered;
        remember which CTA read each cell, for a later store of another CTA."""
        cells, cta = self._cells(size, threads, addr)
        owner = self.stored.get(k)
        if owner is not None:
            prev = owner[cells]
            foreign = (prev >= 0) & (prev != cta)
            if foreign.any():
                foreign &= ~self._ordered(prev, self.stored_at[k][cells], cta)
                if foreign.any():
                    i = _first(foreign) // max(1, size // self.grain)
                    self._conflict(k, i, int(prev[_first(foreign)]), threads, addr, "load of")
        by, at = self._table(self.read_by, k, -1), self._table(self.read_at, k, 0, np.int64)
        prev = by[cells]
        new = np.where((prev == -1) | (prev == cta), cta, self.MANY).astype(np.int32)
        by[cells] = new
        clash = by[cells] != new                    # CTAs of this instruction share a cell
        if clash.any():
            by[cells[clash]] = self.MANY
        at[cells] = self.clock

    def _claim(self, k: int, threads: np.ndarray, size: int, addr: np.ndarray) -> None:
        """Record which CTA stored each cell of buffer ``k``; a cell another CTA of the
        launch stored already (now or by an earlier instruction) is a ``race``, and so is
        one another CTA read, unless that read is ordered before this store."""
        owner = self._table(self.stored, k, -1)
        cells, cta = self._cells(size, threads, addr)
        n = max(1, size // self.grain)
        prev = owner[cells]
        bad = (prev >= 0) & (prev != cta)
        if bad.any():
            self._conflict(k, _first(bad) // n, int(prev[bad][0]), threads, addr)
        if not distinct(cells, self._mark(("cell", k), owner.size)):
            order = np.argsort(cells, kind="stable")
            same = (cells[order][1:] == cells[order][:-1]) & (cta[order][1:] != cta[order][:-1])
            if same.any():
                j = _first(same)
                self._conflict(k, int(order[j + 1]) // n, int(cta[order[j]]), threads, addr)
        by = self.read_by.get(k)
        if by is not None:
            r = by[cells]
            read = (r == self.MANY) | ((r >= 0) & (r != cta))
            if read.any():
                read &= ~self._ordered(r, self.read_at[k][cells], cta)
                if read.any():
                    j = _first(read)
                    other = int(r[j]) if r[j] >= 0 else -1
                    self._conflict(k, j // n, other, threads, addr, "store where", "read")
        owner[cells] = cta
        self._table(self.stored_at, k, 0, np.int64)[cells] = self.clock

    def _conflict(self, k: int, i: int, other: int, threads: np.ndarray, addr,
                  what: str = "store to", did: str = "stored") -> None:
        gx, gy, _ = self.grid
        who = (f"CTA ctaid=({other % gx},{other // gx % gy},{other // (gx * gy)})"
               if other >= 0 else "other CTAs")
        raise Fault("race", threads[i], f"global {what} buffer {k} '{self.names[k]}' where "
                    f"{who} {did} in this launch: CTAs are not ordered (only atom/red may "
                    "share a word across CTAs, or a gpu fence and an atomic order them)",
                    int(addr[i]))

    # ---- the synchronisation clock --------------------------------------------------------

    def fence(self, threads: np.ndarray) -> None:
        """A gpu- or system-scope fence by ``threads``: their CTAs' earlier stores are
        released by their next atomic, and atomics they executed before are acquired."""
        if self.ctas is None:
            return
        cta = self.ctas[threads]
        self.clock += 1
        self.fenced[cta] = self.clock
        self.acquired[cta] = np.maximum(self.acquired[cta], self.atomic_at[cta] + 1)

    def atomic(self, threads: np.ndarray) -> None:
        """An atomic by ``threads`` (in thread order, the order their updates apply):
        each gets the next place in the atomic order; a CTA's first atomic after a
        fence releases its stores before that fence."""
        if self.ctas is None:
            return
        cta = self.ctas[threads]
        seq = self.clock + np.arange(cta.size)
        last = np.r_[cta[1:] != cta[:-1], True]
        first = np.r_[True, cta[1:] != cta[:-1]]
        self.atomic_at[cta[last]] = seq[last]
        c, s = cta[first], seq[first]
        fresh = self.fenced[c] > self.released[c]
        self.released[c[fresh]] = self.fenced[c[fresh]]
        self.release_at[c[fresh]] = s[fresh]
        self.clock += cta.size


class SharedMemory:
    """Per-CTA shared windows plus race tags per ``grain`` bytes.

    ``grain`` is the smallest shared access size in the kernel: every access is aligned
    to its own size, so two accesses share a byte exactly when they share a grain, and
    tracking grains instead of bytes is exact (and 4-16x cheaper for b32/v4 code).
    Tags are ``(epoch << 11) | linear tid``; readers keep the min and max reader tag, so
    "read by someone other than me this epoch" is ``rmin != me or rmax != me``.
    """

    def __init__(self, ctas: int, tpc: int, size: int, strict_init: bool = True,
                 grain: int = 1):
        self.size, self.tpc, self.strict_init, self.grain = size, tpc, strict_init, grain
        self.pad = max(16, -(-size // 16) * 16)
        n = ctas * self.pad
        self.raw = np.zeros(n, np.uint8)
        self.writer = np.full(n // grain, -1, np.int32)  # last writer's tag, -1 never written
        self.rmin = np.full(n // grain, -1, np.int32)    # smallest reader tag
        self.rmax = np.full(n // grain, -1, np.int32)    # largest reader tag
        self.epoch = np.zeros(ctas, np.int32)
        self.pending = np.zeros(n // grain, bool)  # target of a cp.async not yet waited for
        self._mark = np.empty(n // grain, np.int32)   # scratch of distinct()
        self.copies = None          # the launch's in-flight cp.async book (async_copy.py)
        self._views: dict[tuple, np.ndarray] = {}
        self._reads: list = []      # loads since the last barrier, folded in lazily
        self._written = (0, 0)      # window offsets [lo, hi) stored since the last all-CTA barrier
        self._readers = False       # rmin/rmax hold reads since the last all-CTA barrier
        self._read_span = (0, 0)    # the window offsets [lo, hi) those reads cover
        self._cache = None
        self._window = None         # per thread: where its CTA's window starts

    def _view(self, name: str, elem: int, vec: int) -> np.ndarray:
        key = (name, elem, vec)
        if key not in self._views:
            arr = getattr(self, name)
            self._views[key] = (_typed(arr, elem, vec) if name == "raw"
                                else arr.reshape(-1, elem * vec // self.grain))
        return self._views[key]

    def barrier(self, ctas: np.ndarray | None) -> None:
        """bar.sync: every access before it is ordered before every access after it."""
        if ctas is None:
            self._reads.clear()                 # no later write can race with them
            self._readers = False
            self._written = (0, 0)
            self._read_span = (0, 0)
            self.epoch += 1
        else:       # the reads stay deferred: their tags keep the epoch they were made in
            self.epoch[ctas] += 1
            if len(self._reads) > DEFERRED_READS:
                self._fold()
        self._cache = None
        if self.epoch.max() >= (1 << (31 - _TID_BITS)) - 1:   # tag space exhausted
            self._reads.clear()
            written = self.writer >= 0              # keep "ever written" as epoch 0
            self.rmin.fill(-1)
            self.rmax.fill(-1)
            self.writer[:] = np.where(written, 0, -1)
            self.epoch[:] = 1

    def _who(self, threads):
        """(cta, epoch, tag) per thread of ``threads`` (increasing), from the launch's
        arrays of them, made again after each barrier."""
        last = int(threads[-1]) if threads.size else 0
        if self._cache is None or self._cache[0].size <= last:
            every = np.arange(max(last + 1, self.epoch.size * self.tpc))
            cta = every // self.tpc
            ep = self.epoch[cta][:, None]
            self._cache = (cta, ep, ((ep << _TID_BITS) | (every % self.tpc)[:, None])
                           .astype(np.int32))
        cta, ep, tag = self._cache
        if threads.size == cta.size:
            return cta, ep, tag
        tag = take(tag, threads)            # the epoch is in the tag: no gather of its own
        return threads // self.tpc, tag >> _TID_BITS, tag

    def _locate(self, addr, threads, size: int):
        off = np.asarray(addr).astype(np.int64)
        # offsets are >= 0 (u32 registers); the largest and the OR of all say in one pass
        # each whether any is out of bounds or misaligned (then the pass that names it)
        if off.size and (int(off.max()) > self.size - size or
                         int(np.bitwise_or.reduce(off)) & (size - 1)):
            bad = off > self.size - size
            if bad.any():
                i = _first(bad)
                raise Fault("out_of_bounds", threads[i], f"{size}-byte shared access, the "
                            f"shared window is {self.size} bytes", int(off[i]))
            i = _first((off & (size - 1)) != 0)
            raise Fault("misaligned", threads[i], f"{size}-byte shared access needs "
                        f"{size}-byte alignment", int(off[i]))
        cta, ep, tag = self._who(threads)
        rows = self._rows(off, threads, size)
        span = span_of(off, size)
        # only the bytes of copies in flight are pending: look where their spans meet this one
        if self.copies is not None and any(_overlap(span, c.span) for c in self.copies.copies):
            late = take(self._view("pending", size, 1), rows)
            if late.any():
                i, j = np.argwhere(late)[0]
                at = int(off[i]) + int(j) * self.grain
                raise Fault("race", threads[i], f"shared offset {at:#x} is the target of a "
                            "cp.async its thread has not waited for (cp.async.wait_group)", at)
        return rows, cta, ep, tag, off, span

    def _race(self, bad: np.ndarray, tags: np.ndarray, threads, off, cta, what: str):
        i, j = np.argwhere(bad)[0]
        other = int(tags[i, j]) & ((1 << _TID_BITS) - 1)
        at = int(off[i]) + int(j) * self.grain
        raise Fault("race", threads[i], f"shared offset {at:#x} {what} by another thread "
                    "of the CTA since the last bar.sync", at,
                    other=int(cta[i]) * self.tpc + other)

    def _fold(self, span: tuple[int, int] | None = None) -> None:
        """Record the deferred reads in rmin/rmax (needed once a write or a partial
        barrier follows them; a barrier of all CTAs just drops them). With ``span``
        (window offsets [lo, hi) of a store) only the reads that overlap it: a read
        elsewhere cannot race with that store, and stays deferred. (A ring of copy
        stages reads one stage while it refills another, so most reads never fold.)"""
        keep = []
        lo, hi = self._read_span
        for read in self._reads:
            rows, ep, tag, size, (a, b), cta = read
            if span is not None and (b <= span[0] or span[1] <= a):
                keep.append(read)
                continue
            if bool((self.epoch[cta] > ep[:, 0]).all()):
                continue            # every reader's CTA has passed a barrier since
            self._readers = True
            lo, hi = (a, b) if lo == hi else (min(lo, a), max(hi, b))
            lo_, hi_ = self._view("rmin", size, 1), self._view("rmax", size, 1)
            L, H = take(lo_, rows), take(hi_, rows)
            held = H >> _TID_BITS       # the epoch the grain's readers are from
            older, newer = held < ep, held > ep     # newer: folded after a later barrier
            if distinct(rows, self._mark):
                put(lo_, rows, np.where(older, tag, np.where(newer, L, np.minimum(L, tag))))
                put(hi_, rows, np.where(older, tag, np.where(newer, H, np.maximum(H, tag))))
                continue
            put(lo_, rows, np.where(older, tag, L))    # open this epoch, then fold duplicates
            put(hi_, rows, np.where(older, tag, H))    # (which duplicate lands: any, .at folds all)
            k = size // self.grain
            flat = (rows[:, None] * k + np.arange(k)).ravel()
            tags = np.broadcast_to(tag, L.shape)
            np.minimum.at(self.rmin, flat, np.where(newer, np.iinfo(np.int32).max, tags).ravel())
            np.maximum.at(self.rmax, flat, np.where(newer, -1, tags).ravel())
        self._read_span = (lo, hi)
        self._reads = keep

    def load(self, addr, threads, elem: int, vec: int) -> np.ndarray:
        size = elem * vec
        rows, cta, ep, tag, off, span = self._locate(addr, threads, size)
        W = take(self._view("writer", size, 1), rows)
        if self.strict_init and (W < 0).any():
            i, j = np.argwhere(W < 0)[0]
            at = int(off[i]) + int(j) * self.grain
            raise Fault("uninitialized", threads[i], f"shared offset {at:#x} read but never "
                        "written", at)
        if _overlap(span, self._written):
            bad = ((W >> _TID_BITS) == ep) & (W != tag)
            if bad.any():
                self._race(bad, W, threads, off, cta, "written")
        self._reads.append((rows, ep, tag, size, span, cta))
        return take(self._view("raw", elem, vec), rows)

    def claim(self, addr, threads, elem: int, vec: int, values: np.ndarray) -> None:
        """A cp.async issues: a write now (it may land any time until the wait, so it
        races with every unsynchronised access), and its bytes stay ``pending``."""
        rows = self.store(addr, threads, elem, vec, values)
        put(self._view("pending", elem * vec, 1), rows, True)

    def settle(self, addr, threads, elem: int, vec: int) -> None:
        """The issuing thread waited for a cp.async: its bytes are written again now, so
        another thread needs a bar.sync after the wait like after any shared store.
        (The checks of a store cannot fail here: the issue made them, and since then
        every access to a pending byte was refused, so only the writer's tag moves.)"""
        size = elem * vec
        rows = self._rows(addr, threads, size)
        put(self._view("pending", size, 1), rows, False)
        put(self._view("writer", size, 1), rows, self._who(threads)[2])
        at = np.asarray(addr).astype(np.int64)
        self._wrote((int(at.min()), int(at.max()) + size))

    def _wrote(self, span: tuple[int, int]) -> None:
        lo, hi = self._written
        self._written = span if lo == hi else (min(lo, span[0]), max(hi, span[1]))

    def _rows(self, addr, threads, size: int) -> np.ndarray:
        """Rows of ``size`` bytes; ``threads`` increasing, as every caller passes them (so
        as many as the first ``threads[-1] + 1`` are all of those)."""
        last = int(threads[-1]) if threads.size else 0
        if self._window is None or self._window.size <= last:
            every = np.arange(max(last + 1, self.epoch.size * self.tpc))
            self._window = every // self.tpc * self.pad
        start = self._window if threads.size == self._window.size else self._window[threads]
        return (start + np.asarray(addr).astype(np.int64)) >> (size.bit_length() - 1)  # size: 2^n

    def store(self, addr, threads, elem: int, vec: int, values: np.ndarray) -> np.ndarray:
        """Returns the rows of ``_view(..., elem * vec, 1)`` it wrote."""
        size = elem * vec
        rows, cta, ep, tag, off, span = self._locate(addr, threads, size)
        wv = self._view("writer", size, 1)
        if _overlap(span, self._written):
            W = take(wv, rows)
            bad = ((W >> _TID_BITS) == ep) & (W != tag)
            if bad.any():
                self._race(bad, W, threads, off, cta, "written")
        if self._reads:
            self._fold(span)
        if self._readers and _overlap(span, self._read_span):
            L, H = take(self._view("rmin", size, 1), rows), take(self._view("rmax", size, 1), rows)
            bad = ((H >> _TID_BITS) == ep) & ((L != tag) | (H != tag))
            if bad.any():
                self._race(bad, np.where(L != tag, L, H), threads, off, cta, "read")
        if not distinct(rows, self._mark):
            order = np.argsort(rows, kind="stable")
            same = np.flatnonzero(rows[order][1:] == rows[order][:-1])
            if same.size:
                a, b = order[same[0]], order[same[0] + 1]
                raise Fault("race", threads[max(a, b)], f"shared offset {int(off[a]):#x} "
                            "written by two threads in one instruction", int(off[a]),
                            other=threads[min(a, b)])
        put(wv, rows, tag)
        self._wrote(span)
        put(self._view("raw", elem, vec), rows, values)
        return rows
