"""Every storage a stretch of PyTorch code makes and frees, in order, with the stream each was
made on: the request sequence a CUDA caching allocator would see (replayed by
jobctl_measure.caching_allocator).

Works on the CPU, under FakeTensorMode too (a fake tensor's storage has its sizes, no bytes):
benchmarks/trace_memory.py --allocator records torchtitan's and HF's training steps with it.
Needs torch (the test extra).
"""

from __future__ import annotations

import itertools
import weakref

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary


class AllocRecorder(TorchDispatchMode):
    """Every storage made under it, in order: ("a", id, bytes, stream), ("f", id), ("m", label).

    A storage is born when an op first returns a tensor on it, and dies when Python drops
    its last reference (a weakref finalizer): the order in which the CUDA caching allocator
    would be asked for and given back each block, since FSDP2 frees its cross-stream
    buffers by dropping references after an event wait, not with record_stream.  The
    stream is torch.cpu.current_stream() at the allocation: FSDP2 allocates its
    all-gather, copy-in and reduce-scatter buffers under its own streams' contexts, which
    on a CPU build are distinct Stream objects.  Storage resizes (FSDP2's unsharded
    parameters: resize_ to the full size before the all-gather's copy-out, to 0 after)
    are an allocation of the new size and a free of the old."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple] = []
        self._ids = itertools.count()
        self._cells = WeakIdKeyDictionary()   # storage -> [current id or None]
        self.streams: list[object] = []        # first-seen order; index = stream id
        self.origin: dict[int, str] = {}       # id -> the op (or resize_) that made it
        self._orig_resize = None
        self._op = "?"
        self._skip = 0  # inside DTensor's sharding propagation

    def stream_index(self) -> int:
        """The current stream's index in `streams` (added when first seen)."""
        s = torch.cpu.current_stream()
        for i, x in enumerate(self.streams):
            if x is s:
                return i
        self.streams.append(s)
        return len(self.streams) - 1

    def mark(self, label: str) -> None:
        """A ("m", label) event: where a phase ends (the replay reports each phase's maxima)."""
        self.events.append(("m", label))

    def _freed(self, cell):
        if cell[0] is not None:
            self.events.append(("f", cell[0]))
            cell[0] = None

    def _born(self, nbytes):
        sid = next(self._ids)
        self.events.append(("a", sid, nbytes, self.stream_index()))
        self.origin[sid] = self._op
        return sid

    def _see(self, t):
        if self._skip or isinstance(t, DTensor) or t.device.type != "cpu":
            return
        st = t.untyped_storage()
        if st in self._cells:
            return
        cell = [self._born(st.nbytes()) if st.nbytes() else None]
        self._cells[st] = cell
        weakref.finalize(st, self._freed, cell)

    def _resized(self, st, old, new):
        cell = self._cells.get(st)
        if cell is None:
            cell = [None]
            self._cells[st] = cell
            weakref.finalize(st, self._freed, cell)
        if old == new:
            return
        prev = cell[0]
        cell[0] = self._born(new) if new else None
        if prev is not None:  # the old block is given back after the copy into the new one
            self.events.append(("f", prev))

    def __enter__(self):
        rec, orig = self, torch.UntypedStorage.resize_
        self._orig_resize = orig

        def resize_(st, size):
            old = st.nbytes()
            rec._op = "resize_"
            out = orig(st, size)
            if rec._skip == 0:  # (a fake tensor's storage is on the meta device)
                rec._resized(st, old, st.nbytes())
            return out

        torch.UntypedStorage.resize_ = resize_
        # DTensor's sharding propagation builds global-shape tensors from its specs
        # (_op_schema.gen_fake_args) to run the op's meta function, and caches them: no
        # device ever holds those, so nothing made inside it is recorded.
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
        orig_prop = self._orig_prop = ShardingPropagator._propagate_tensor_meta_non_cached

        def propagate(*a, **k):
            rec._skip += 1
            try:
                return orig_prop(*a, **k)
            finally:
                rec._skip -= 1

        ShardingPropagator._propagate_tensor_meta_non_cached = propagate
        return super().__enter__()

    def __exit__(self, *a):
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
        torch.UntypedStorage.resize_ = self._orig_resize
        ShardingPropagator._propagate_tensor_meta_non_cached = self._orig_prop
        return super().__exit__(*a)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        self._op = str(func)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._see(t)
        return out

