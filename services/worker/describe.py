"""The worker's Describe answer: build, model, topology and cache geometry, for the scheduler's
handshake."""
from __future__ import annotations

import secrets

from services.common.build_info import ABI_VERSION, build_id
from services.common.config import WorkerConfig
from services.common.pb.dsv4serve.v1 import worker_pb2
from services.worker.capacity import ModelFacts


def describe_response(config: WorkerConfig, facts: ModelFacts) -> worker_pb2.DescribeResponse:
    """The static part of Describe (`world_round` is filled in per call); `instance_id` is drawn
    once per process."""
    topology = config.topology
    ranks = config.driven_ranks
    return worker_pb2.DescribeResponse(
        abi_version=ABI_VERSION, build_id=build_id(), model_fingerprint=facts.model_fingerprint,
        topology=worker_pb2.Topology(world_size=topology.world_size, dp=topology.dp, tp=topology.tp,
                                     ep=topology.ep, host_ranks=ranks, backend=topology.backend),
        block_size=config.block_size, vocab_size=facts.vocab_size,
        eos_token_id=facts.eos_token_id,
        partition_ids=sorted({rank // topology.tp for rank in ranks}),
        block_groups=[worker_pb2.BlockGroup(name=group.name, num_blocks=group.num_blocks,
                                            bytes_per_block=group.bytes_per_block,
                                            sliding_window=group.sliding_window)
                      for group in facts.block_groups],
        cache_families=[worker_pb2.CacheFamily(name=family.name, group=family.group,
                                               rows_per_block=family.rows_per_block,
                                               bytes_per_block=family.bytes_per_block)
                        for family in facts.cache_families],
        max_num_batched_tokens=config.max_num_batched_tokens, compute_dtype=facts.compute_dtype,
        max_num_seqs=facts.max_num_seqs, instance_id=secrets.randbits(63))
