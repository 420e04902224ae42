"""Landing probe for 0002: does a Mamba "align" group stay bounded in prefill?

Drives the tree's own KVCacheManager on the CPU through the chunked prefill
of one long prompt, with one step always in flight when the next is
scheduled (async scheduling, vLLM's default), and counts the blocks the
Mamba group holds after each prefill step. A group that retires its old
state blocks holds a bounded number; the null-gap bug makes it hold one
more per step.

Run with the tree on PYTHONPATH (vpatch runs it with cwd = the tree root).
Exit 0: bounded (fix present). Exit 1: growing (bug present). Exit 2: the
probe could not decide, because
- the tree's KVCacheManager does not accept every argument the scenario
  needs (a renamed switch would silently run another scenario), or
- the scenario did not reach the bug's code path: the Mamba group's table
  never held a null gap during prefill, or fewer than MIN_IN_FLIGHT_STEPS
  prefill steps were scheduled with one step in flight.
"""

from __future__ import annotations

import inspect
import os
import sys

PROMPT_TOKENS = 65_536
CHUNK_TOKENS = 2_048
BLOCK_SIZE = 544
NUM_BLOCKS = 4_096
# A fixed group retires all but the running and the previous state (plus a
# possible block in flight), so it never needs more than a handful.
BOUND = 4
# The growth only shows over several steps: with the bug the group holds one
# more block per step, so well past BOUND needs at least 2 * BOUND of them.
MIN_IN_FLIGHT_STEPS = 2 * BOUND
# vpatch's probe exit codes (vpatch.probes): 0 fixed, 1 bug, 2 cannot decide.
ERROR = 2


class CannotDecide(Exception):
    """The tree does not let the probe build or reach its scenario."""


def _build_manager():
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )

    try:
        # Newer trees register managers lazily; older ones at import time.
        from vllm.v1.core.single_type_kv_cache_manager import (
            register_all_kvcache_specs,
        )

        register_all_kvcache_specs(None)
    except ImportError:
        pass

    config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["full_attn"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE,
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                ),
            ),
            KVCacheGroupSpec(
                ["mamba"],
                MambaSpec(
                    block_size=BLOCK_SIZE,
                    shapes=((1, 1),),
                    dtypes=(torch.float32,),
                    mamba_cache_mode="align",
                ),
            ),
        ],
    )
    kwargs = {
        "max_model_len": PROMPT_TOKENS + 1_024,
        "scheduler_block_size": BLOCK_SIZE,
        "hash_block_size": BLOCK_SIZE,
        "enable_caching": True,
    }
    accepted = inspect.signature(KVCacheManager.__init__).parameters
    rejected = [name for name in kwargs if name not in accepted]
    if rejected:
        raise CannotDecide(
            "KVCacheManager does not accept " + ", ".join(rejected)
            + ": without it the scenario is a different one; update the probe"
        )
    return KVCacheManager(config, **kwargs)


def _build_request():
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import (
        get_request_block_hasher,
        init_none_hash,
    )
    from vllm.v1.request import Request

    init_none_hash(sha256)
    params = SamplingParams(max_tokens=16)
    params.update_from_generation_config({}, 0)
    return Request(
        request_id="probe-0002",
        # Distinct tokens so no block hashes collide with each other.
        prompt_token_ids=[(i % 30_000) + 1 for i in range(PROMPT_TOKENS)],
        sampling_params=params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
    )


def _aligned_chunk(start: int, prompt_tokens: int) -> int:
    # Align mode ends every prefill chunk but the last on a block boundary, so
    # that each state block holds the state after a whole number of blocks.
    end = start + CHUNK_TOKENS
    if end >= prompt_tokens:
        return prompt_tokens - start
    return end // BLOCK_SIZE * BLOCK_SIZE - start


def held_blocks_per_step() -> list[int]:
    """The Mamba blocks held after each prefill step; CannotDecide when the
    run never reached the code that frees state blocks across null gaps."""
    manager = _build_manager()
    request = _build_request()
    mamba = manager.coordinator.single_type_managers[1]
    in_flight: list[int] = []
    held: list[int] = []
    gap_steps = 0  # steps after which the table had a null block below a held one
    in_flight_steps = 0  # steps scheduled while the previous one was in flight
    while request.num_computed_tokens < request.num_prompt_tokens:
        in_flight_steps += request.num_in_flight_tokens > 0
        manager.new_step_starts()
        chunk = _aligned_chunk(request.num_computed_tokens, request.num_prompt_tokens)
        if manager.allocate_slots(request, chunk) is None:
            raise RuntimeError("the probe's block pool ran out")
        # What the scheduler does once a step is scheduled.
        request.num_computed_tokens += chunk
        request.num_in_flight_tokens += chunk
        in_flight.append(chunk)
        # Async scheduling: the previous step finishes only after this one
        # was scheduled, so one step is always in flight at allocation time.
        if len(in_flight) > 1:
            request.num_in_flight_tokens -= in_flight.pop(0)
        blocks = mamba.req_to_blocks[request.request_id]
        real = [i for i, block in enumerate(blocks) if not block.is_null]
        gap_steps += bool(real) and any(b.is_null for b in blocks[: real[-1]])
        held.append(len(real))
    print(
        f"prefill steps: {len(held)}, with one in flight: {in_flight_steps}, "
        f"with null gaps in the mamba table: {gap_steps}"
    )
    if not gap_steps:
        raise CannotDecide(
            "the mamba group's table never held a null gap during prefill: "
            "the scenario did not reach the code that frees across gaps"
        )
    if in_flight_steps < MIN_IN_FLIGHT_STEPS:
        raise CannotDecide(
            f"only {in_flight_steps} prefill steps were scheduled with one in "
            f"flight (at least {MIN_IN_FLIGHT_STEPS} needed)"
        )
    return held


def main() -> int:
    sys.path.insert(0, os.getcwd())
    try:
        held = held_blocks_per_step()
    except CannotDecide as exc:
        print(f"cannot decide: {exc}")
        return ERROR
    except Exception as exc:  # noqa: BLE001 - any failure here means "cannot decide"
        print(f"probe error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return ERROR
    print(
        f"mamba align prefill: prompt={PROMPT_TOKENS} chunk={CHUNK_TOKENS} "
        f"block_size={BLOCK_SIZE} async=1"
    )
    print("held mamba blocks per prefill step: " + " ".join(map(str, held)))
    print(f"max held: {max(held)} (bound {BOUND})")
    if max(held) <= BOUND:
        print("PASS: the mamba group stays bounded during prefill")
        return 0
    print("FAIL: the mamba group holds one more block per prefill step")
    return 1


if __name__ == "__main__":
    sys.exit(main())
