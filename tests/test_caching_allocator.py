"""The caching-allocator model (jobctl_measure/caching_allocator.py) against hand derivations.

Each expected figure is worked out in the test from the rules of PyTorch's
c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator: round_size, get_allocation_size,
get_free_block, should_split, alloc_found_block, free_block, try_allocate_expandable_block,
map_block, release_cached_blocks), not read back from the model: 512-byte rounding; requests
of at most 1 MiB from the small pool (2 MiB segments), larger ones from the large pool (20 MiB
segments below 10 MiB, else the size rounded up to 2 MiB); best fit within the request's own
stream; a large block split only when more than 1 MiB would be left (any 512 B with expandable
segments); expandable segments map 20 MiB pages of the large pool on demand."""

import pytest

from jobctl_measure import caching_allocator as ca

MiB = 1 << 20


def test_rounding_rules():
    # round_size: below kMinBlockSize (512) -> 512, else up to a multiple of 512
    assert [ca.round_size(n) for n in (1, 511, 512, 513, 1000)] == [512, 512, 512, 1024, 1024]
    # get_allocation_size on the rounded size: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB; else up to 2 MiB
    assert ca.allocation_size(1 * MiB) == 2 * MiB
    assert ca.allocation_size(1 * MiB + 512) == 20 * MiB
    assert ca.allocation_size(10 * MiB - 512) == 20 * MiB
    assert ca.allocation_size(10 * MiB) == 10 * MiB
    assert ca.allocation_size(10 * MiB + 512) == 12 * MiB


def test_small_requests_share_a_2_mib_segment():
    a = ca.CachingAllocator()
    a.malloc(100)
    a.malloc(100)
    # two 512-byte blocks split off one 2 MiB small segment
    assert (a.reserved, a.allocated, a.requested) == (2 * MiB, 1024, 200)


def test_large_block_split_only_above_1_mib_remainder():
    a = ca.CachingAllocator()
    a.malloc(3 * MiB)  # 3 MiB < 10 MiB: a 20 MiB segment, split (17 MiB left > 1 MiB)
    assert (a.reserved, a.allocated) == (20 * MiB, 3 * MiB)
    a.malloc(16 * MiB + MiB // 2)  # fits the 17 MiB remainder; 0.5 MiB left is not > 1 MiB: whole block
    assert (a.reserved, a.allocated) == (20 * MiB, 20 * MiB)


def test_segments_do_not_merge_without_expandable_segments():
    a = ca.CachingAllocator()
    x, y = a.malloc(12 * MiB), a.malloc(12 * MiB)  # two 12 MiB segments (>= 10 MiB: exact, 2 MiB multiple)
    a.free(x)
    a.free(y)
    a.malloc(20 * MiB)  # no cached block of 20 MiB: free segments are not adjacent, a third segment
    assert a.reserved == 44 * MiB


def test_expandable_segments_map_pages_and_merge():
    a = ca.CachingAllocator(expandable_segments=True)
    x = a.malloc(12 * MiB)  # maps one 20 MiB page; 8 MiB stay free at the end
    assert a.reserved == 20 * MiB
    y = a.malloc(12 * MiB)  # the 8 MiB free block grows into a second page: 40 MiB mapped
    assert a.reserved == 40 * MiB
    a.free(x)
    a.free(y)  # one segment: the two blocks and the free tail merge into 40 MiB
    a.malloc(20 * MiB)
    assert a.reserved == 40 * MiB


def test_no_reuse_across_streams():
    a = ca.CachingAllocator()
    a.free(a.malloc(12 * MiB, stream="side"))
    a.malloc(12 * MiB, stream="main")  # the cached block belongs to the other stream's pool
    assert a.reserved == 24 * MiB
    assert a.reserved_by_stream == {"side": 12 * MiB, "main": 12 * MiB}


def test_best_fit_takes_the_smallest_block_that_fits():
    a = ca.CachingAllocator()
    big, small = a.malloc(30 * MiB), a.malloc(14 * MiB)
    a.free(big)
    a.free(small)
    b = a.malloc(13 * MiB)  # the 14 MiB block; 1 MiB left is not > 1 MiB, so not split
    assert b.size == 14 * MiB
    assert (a.reserved, a.allocated) == (44 * MiB, 14 * MiB)


def test_expandable_prefers_a_block_that_does_not_border_unmapped_space():
    a = ca.CachingAllocator(expandable_segments=True)
    x = a.malloc(20 * MiB)
    a.malloc(20 * MiB)
    a.malloc(4 * MiB)  # a third 20 MiB page: 16 MiB free at the end, next to unmapped space
    a.free(x)  # a 20 MiB hole between allocated blocks
    b = a.malloc(10 * MiB)
    # by size alone the 16 MiB tail block fits best; get_free_block's expandable_size rule
    # skips it for the next larger block, the hole, whose start the request takes
    assert b.addr == x.addr
    assert a.reserved == 60 * MiB


def test_release_cached_blocks_before_failing():
    a = ca.CachingAllocator(capacity=40 * MiB)
    a.free(a.malloc(20 * MiB, stream="side"))
    a.malloc(30 * MiB, stream="main")  # 20 + 30 > 40: the free side segment is released, then it fits
    assert a.reserved == 30 * MiB
    assert a.num_alloc_retries == 1
    with pytest.raises(ca.OutOfMemory):
        a.malloc(12 * MiB, stream="main")  # 30 + 12 > 40 and nothing cached to release


def test_replay_reports_per_mark_and_the_state_at_the_peak():
    events = [("a", 1, 12 * MiB, 0), ("a", 2, 12 * MiB, 1), ("f", 2), ("m", "step 1"),
              ("f", 1), ("a", 3, 14 * MiB, 0), ("m", "step 2")]
    r = ca.replay(events)
    # 12 + 12 MiB segments; then the 12 MiB block of stream 0 is free but 14 MiB needs a new one
    assert r["max_reserved"] == 38 * MiB
    assert [p["max_reserved"] for p in r["phases"]] == [24 * MiB, 38 * MiB]
    at = r["at_peak"]["streams"]
    assert at[0] == {"reserved": 26 * MiB, "free": 12 * MiB, "largest_free": 12 * MiB, "allocated": 14 * MiB}
    assert at[1]["free"] == 12 * MiB


def test_expandable_release_unmaps_whole_free_pages():
    a = ca.CachingAllocator(expandable_segments=True, capacity=40 * MiB)
    a.free(a.malloc(20 * MiB, stream="side"))  # one mapped page, free
    a.malloc(30 * MiB, stream="main")  # two pages (40 MiB): 20 + 40 > 40, so the free page is unmapped
    assert a.reserved == 40 * MiB
    assert a.reserved_by_stream["side"] == 0


def test_expandable_release_after_blocks_merged_into_the_segment_start():
    a = ca.CachingAllocator(expandable_segments=True, capacity=60 * MiB)
    x, y = a.malloc(20 * MiB, stream="side"), a.malloc(20 * MiB, stream="side")  # two pages
    a.free(x)
    a.free(y)  # y absorbs x, the segment's first block: one free 40 MiB block
    a.malloc(40 * MiB, stream="main")  # 40 + 40 > 60: the side stream's two pages are unmapped
    assert a.reserved_by_stream == {"side": 0, "main": 40 * MiB}
    a.malloc(20 * MiB, stream="side")  # the side segment maps a page again at its start
    assert a.reserved == 60 * MiB
