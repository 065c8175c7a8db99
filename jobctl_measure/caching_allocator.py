"""A model of PyTorch's CUDA caching allocator, for replaying a recorded sequence of tensor
allocations and frees and reading off what `torch.cuda.max_memory_reserved()` would say.

Why: a trace on fake tensors (jobctl_measure.alloc_recorder, run by benchmarks/trace_memory.py
--allocator) knows every tensor a training step holds, but published peaks (torchtitan's
benchmark tables) are *reserved* bytes: what the allocator has taken from the driver, which
includes blocks it caches for reuse and the holes between live blocks.  That slack depends on
the order and sizes of allocations, not on any one term, so it is simulated here rather than
guessed.

Modelled from c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x, DeviceCachingAllocator), default
configuration unless said otherwise:
  * sizes are rounded up to 512 bytes (round_size; kMinBlockSize);
  * requests of at most 1 MiB (kSmallSize) come from the small pool, larger ones from the large
    pool; there is one pool pair per stream (blocks are looked up by (stream, size, address)
    and a block freed on any stream returns to the pool of the stream it was allocated on);
  * a request takes the smallest cached free block of its stream and pool that fits
    (get_free_block: lower_bound on (stream, size)); no max_split_size by default;
  * the block is split when the rest is worth keeping (should_split: small pool, or any pool
    with expandable segments, when the rest is >= 512 B; large pool otherwise when the rest
    is > 1 MiB); the request gets the lower addresses, the rest stays cached;
  * a freed block merges with free neighbours of the same segment (free_block / try_merge_blocks);
  * when nothing cached fits, without expandable segments a new segment is cudaMalloc'd of
    get_allocation_size(size): 2 MiB (kSmallBuffer) for small requests, 20 MiB (kLargeBuffer)
    below 10 MiB (kMinLargeAlloc), else the size rounded up to 2 MiB (kRoundLarge);
  * with expandable_segments:True each (stream, pool) has one segment of reserved address
    space into which physical pages are mapped on demand (2 MiB pages for the small pool,
    20 MiB for the large): a request that no free block fits extends the free block at the
    end of the mapped range (or a new one) by mapping the pages its rounded size still
    lacks (find_expandable_block / try_allocate_expandable_block / map_block: the rounded
    size, not get_allocation_size's); and a free block that borders the unmapped space is
    taken only when no larger free block fits (get_free_block's expandable_size rule);
  * reserved bytes = cudaMalloc'd segments, or mapped pages; they shrink only when a request
    cannot be met within the device's capacity, in which case every fully free segment (or
    every fully free mapped page) is released and the request retried (release_cached_blocks);
  * allocated bytes count whole blocks (a request that is not split holds the whole block).
Not modelled: max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold,
record_stream (deferred frees), CUDA graphs' private pools.

Pure Python, no torch: tests/test_caching_allocator.py holds it to hand derivations.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

MIN_BLOCK = 512                # kMinBlockSize
SMALL_SIZE = 1 << 20           # kSmallSize: largest request served by the small pool
SMALL_BUFFER = 2 << 20         # kSmallBuffer: small-pool segment / page
LARGE_BUFFER = 20 << 20        # kLargeBuffer: large-pool segment below kMinLargeAlloc / page
MIN_LARGE_ALLOC = 10 << 20     # kMinLargeAlloc
ROUND_LARGE = 2 << 20          # kRoundLarge


def round_size(nbytes: int) -> int:
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * -(-nbytes // MIN_BLOCK)


def allocation_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)


class OutOfMemory(Exception):
    pass


_ids = itertools.count()


@dataclass(eq=False)
class Block:
    addr: int
    size: int
    stream: object
    small: bool
    segment: int
    allocated: bool = False
    mapped: bool = True
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)
    requested: int = 0

    def key(self):
        return (self.size, self.addr)


def _expandable_size(b: Block) -> int:
    return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)


class _Pool:
    """Free mapped blocks of one (stream, small/large) pool, ordered by (size, address)."""

    def __init__(self):
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, int], Block] = {}

    def add(self, b: Block):
        k = b.key()
        bisect.insort(self.keys, k)
        self.blocks[k] = b

    def remove(self, b: Block):
        k = b.key()
        i = bisect.bisect_left(self.keys, k)
        assert self.keys[i] == k, "block not in its pool"
        del self.keys[i]
        del self.blocks[k]

    def best_fit(self, size: int, expandable: bool = False) -> Block | None:
        i = bisect.bisect_left(self.keys, (size, -1))
        if i == len(self.keys):
            return None
        b = self.blocks[self.keys[i]]
        # get_free_block with expandable segments: a block that borders unmapped space could
        # grow into it, so a larger block that does not is preferred while one exists
        while expandable and i + 1 < len(self.keys):
            nb = self.blocks[self.keys[i + 1]]
            if _expandable_size(nb) >= _expandable_size(b):
                break
            i, b = i + 1, nb
        return b


class CachingAllocator:
    """One device's caching allocator.  malloc(nbytes, stream) -> handle; free(handle)."""

    def __init__(self, expandable_segments: bool = False, capacity: int | None = None):
        self.expandable = expandable_segments
        self.capacity = capacity
        self.pools: dict[tuple[object, bool], _Pool] = {}
        self.segments: dict[tuple[object, bool], Block] = {}  # expandable: first block of each
        self.next_addr = 1 << 40
        self.reserved = 0
        self.allocated = 0
        self.requested = 0
        self.max_reserved = 0
        self.max_allocated = 0
        self.max_requested = 0
        self.reserved_by_stream: dict[object, int] = {}
        self.num_alloc_retries = 0

    # -- public ---------------------------------------------------------------------
    def malloc(self, nbytes: int, stream=0) -> Block:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self.pools.setdefault((stream, small), _Pool())
        block = pool.best_fit(size, self.expandable)
        if block is None:
            # cudaMalloc of a whole segment, or (expandable) pages for the rounded size itself
            block = self._grow(stream, small, size if self.expandable else allocation_size(size))
        pool.remove(block)
        if self._should_split(block, size):
            rest = Block(block.addr + size, block.size - size, stream, small, block.segment,
                         prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.add(rest)
        block.allocated = True
        block.requested = nbytes
        self.allocated += block.size
        self.requested += nbytes
        self.max_allocated = max(self.max_allocated, self.allocated)
        self.max_requested = max(self.max_requested, self.requested)
        return block

    def free(self, block: Block):
        assert block.allocated, "double free"
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        pool = self.pools[(block.stream, block.small)]
        for nb in (block.prev, block.next):
            if nb is not None and not nb.allocated and nb.mapped:
                pool.remove(nb)
                self._merge(block, nb)
        pool.add(block)

    # -- internals --------------------------------------------------------------------
    def _should_split(self, block: Block, size: int) -> bool:
        rest = block.size - size
        if block.small or self.expandable:
            return rest >= MIN_BLOCK
        return rest > SMALL_SIZE

    def _merge(self, dst: Block, src: Block):
        """Absorb the adjacent block src into dst (same segment, same state)."""
        key = (src.stream, src.small)
        if self.segments.get(key) is src:  # an expandable segment's first block
            self.segments[key] = dst
        if src is dst.prev:
            dst.addr = src.addr
            dst.prev = src.prev
            if src.prev is not None:
                src.prev.next = dst
        else:
            dst.next = src.next
            if src.next is not None:
                src.next.prev = dst
        dst.size += src.size

    def _reserve(self, stream, nbytes: int):
        self.reserved += nbytes
        self.reserved_by_stream[stream] = self.reserved_by_stream.get(stream, 0) + nbytes
        if self.reserved > self.max_reserved:
            self.max_reserved = self.reserved
            self.on_new_peak()

    def on_new_peak(self):
        """Called when reserved bytes reach a new maximum (replay() records the state)."""

    def state(self) -> dict:
        """Per stream: reserved, allocated and cached-free bytes, and the largest free block."""
        out: dict = {}
        for (stream, small), pool in self.pools.items():
            d = out.setdefault(stream, {"reserved": self.reserved_by_stream.get(stream, 0),
                                        "free": 0, "largest_free": 0})
            for b in pool.blocks.values():
                d["free"] += b.size
                d["largest_free"] = max(d["largest_free"], b.size)
        for d in out.values():
            d["allocated"] = d["reserved"] - d["free"]
        return out

    def _grow(self, stream, small: bool, alloc_size: int) -> Block:
        for attempt in (0, 1):
            need = self._growth_needed(stream, small, alloc_size)
            if self.capacity is None or self.reserved + need <= self.capacity:
                break
            if attempt == 0:
                self.num_alloc_retries += 1
                self.release_cached()
        else:
            raise OutOfMemory(f"{alloc_size} bytes requested with {self.reserved} reserved of {self.capacity}")
        if not self.expandable:
            seg = next(_ids)
            b = Block(self.next_addr, alloc_size, stream, small, seg)
            self.next_addr += alloc_size + (1 << 30)
            self._reserve(stream, alloc_size)
            self.pools[(stream, small)].add(b)
            return b
        return self._extend(stream, small, alloc_size)

    # expandable segments ---------------------------------------------------------------
    def _page(self, small: bool) -> int:
        return SMALL_BUFFER if small else LARGE_BUFFER

    def _tail(self, stream, small: bool) -> Block:
        """The unmapped block at the end of this pool's segment (created on first use)."""
        first = self.segments.get((stream, small))
        if first is None:
            first = Block(self.next_addr, 1 << 50, stream, small, next(_ids), mapped=False)
            self.next_addr += 1 << 51
            self.segments[(stream, small)] = first
        b = first
        while b.next is not None:
            b = b.next
        assert not b.mapped, "expandable segment fully mapped"
        return b

    def _growth_needed(self, stream, small: bool, alloc_size: int) -> int:
        if not self.expandable:
            return alloc_size
        tail = self._tail(stream, small)
        before = tail.prev
        have = before.size if before is not None and not before.allocated and before.mapped else 0
        page = self._page(small)
        return page * -(-(alloc_size - have) // page)

    def _extend(self, stream, small: bool, alloc_size: int) -> Block:
        tail = self._tail(stream, small)
        pool = self.pools[(stream, small)]
        grow = self._growth_needed(stream, small, alloc_size)
        # map `grow` bytes at the start of the unmapped tail
        new = Block(tail.addr, grow, stream, small, tail.segment, prev=tail.prev, next=tail)
        if tail.prev is not None:
            tail.prev.next = new
        else:
            self.segments[(stream, small)] = new
        tail.prev = new
        tail.addr += grow
        tail.size -= grow
        self._reserve(stream, grow)
        before = new.prev
        if before is not None and not before.allocated and before.mapped:
            pool.remove(before)
            self._merge(new, before)
        pool.add(new)
        return new

    def release_cached(self):
        """release_cached_blocks: give back every fully free segment / fully free page."""
        for (stream, small), pool in self.pools.items():
            for k in list(pool.keys):
                b = pool.blocks[k]
                if not self.expandable:
                    if b.prev is None and b.next is None:
                        pool.remove(b)
                        self.reserved -= b.size
                        self.reserved_by_stream[stream] -= b.size
                    continue
                page = self._page(small)
                first = self.segments[(stream, small)].addr
                lo = first + page * -(-(b.addr - first) // page)
                hi = first + page * ((b.addr + b.size - first) // page)
                if hi <= lo:
                    continue
                # keep the free bytes outside whole pages; unmap the pages in between
                pool.remove(b)
                self._unmap(b, lo, hi, pool)
                self.reserved -= hi - lo
                self.reserved_by_stream[stream] -= hi - lo

    def _unmap(self, b: Block, lo: int, hi: int, pool: _Pool):
        pieces = []
        if lo > b.addr:
            pieces.append((b.addr, lo - b.addr, True))
        pieces.append((lo, hi - lo, False))
        if b.addr + b.size > hi:
            pieces.append((hi, b.addr + b.size - hi, True))
        prev, nxt = b.prev, b.next
        made = []
        for addr, size, mapped in pieces:
            made.append(Block(addr, size, b.stream, b.small, b.segment, mapped=mapped))
        for x, y in itertools.pairwise(made):
            x.next, y.prev = y, x
        made[0].prev, made[-1].next = prev, nxt
        if prev is not None:
            prev.next = made[0]
        else:
            self.segments[(b.stream, b.small)] = made[0]
        if nxt is not None:
            nxt.prev = made[-1]
        for m in made:
            if m.mapped:
                pool.add(m)
        # neighbouring unmapped ranges merge
        for m in made:
            if not m.mapped:
                for nb in (m.prev, m.next):
                    if nb is not None and not nb.mapped and not nb.allocated:
                        self._merge(m, nb)


def replay(events, expandable_segments: bool = False, capacity: int | None = None,
           marks: bool = True) -> dict:
    """Replay [("a", id, nbytes, stream) | ("f", id) | ("m", label)] and report.

    Returns max reserved/allocated/requested and, per "m" mark, the figures at that point
    and the maxima since the previous mark (so per training step)."""
    alloc = CachingAllocator(expandable_segments, capacity)
    live: dict[int, Block] = {}
    at_peak: dict = {}
    cursor = [None]

    def on_new_peak():
        at_peak.clear()
        at_peak.update(event=cursor[0], streams=alloc.state())

    alloc.on_new_peak = on_new_peak
    phases = []
    since = {"reserved": 0, "allocated": 0, "requested": 0}

    def bump():
        since["reserved"] = max(since["reserved"], alloc.reserved)
        since["allocated"] = max(since["allocated"], alloc.allocated)
        since["requested"] = max(since["requested"], alloc.requested)

    for ev in events:
        kind = ev[0]
        cursor[0] = ev
        if kind == "a":
            live[ev[1]] = alloc.malloc(ev[2], ev[3])
            bump()
        elif kind == "f":
            b = live.pop(ev[1], None)
            if b is not None:
                alloc.free(b)
        elif kind == "m" and marks:
            phases.append({"label": ev[1], "max_reserved": since["reserved"],
                           "max_allocated": since["allocated"], "max_requested": since["requested"],
                           "reserved": alloc.reserved})
            since = {"reserved": alloc.reserved, "allocated": alloc.allocated, "requested": alloc.requested}
    return {"max_reserved": alloc.max_reserved, "max_allocated": alloc.max_allocated,
            "max_requested": alloc.max_requested, "reserved": alloc.reserved,
            "reserved_by_stream": dict(alloc.reserved_by_stream), "phases": phases, "at_peak": at_peak,
            "alloc_retries": alloc.num_alloc_retries}
