"""worker.proto DescribeResponse → the scheduler's `WorkerDescription`."""
from __future__ import annotations

from services.common.pb.dsv4serve.v1 import worker_pb2
from services.scheduler.kv_cache import BlockGroupSpec
from services.scheduler.worker_description import WorkerDescription, WorldTopology


def description_from_proto(response: worker_pb2.DescribeResponse) -> WorkerDescription:
    topology = response.topology
    return WorkerDescription(
        abi_version=response.abi_version, build_id=response.build_id,
        model_fingerprint=response.model_fingerprint, block_size=response.block_size,
        vocab_size=response.vocab_size, eos_token_id=response.eos_token_id,
        partition_ids=tuple(response.partition_ids),
        block_groups=tuple(BlockGroupSpec(g.name, g.num_blocks, g.sliding_window)
                           for g in response.block_groups),
        max_num_batched_tokens=response.max_num_batched_tokens,
        topology=WorldTopology(topology.world_size, topology.dp, topology.tp, topology.ep,
                               topology.backend),
        host_ranks=tuple(topology.host_ranks), world_round=response.world_round,
        compute_dtype=response.compute_dtype, max_num_seqs=response.max_num_seqs,
        instance_id=response.instance_id)
