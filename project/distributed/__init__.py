"""Scaling out: FSDP2 sharding per block and the strategy that drives it.

DDP and FSDP (v1) need nothing here: Lightning's own strategies wrap the module (see configs/trainer/).
"""

from project.distributed.fsdp2 import FSDP2Strategy
from project.distributed.sharding import BLOCK_TYPES, shard_network, sharding_units

__all__ = ["BLOCK_TYPES", "FSDP2Strategy", "shard_network", "sharding_units"]
