"""kvlab's configuration: every option declared once (options.py), resolved into one ``KvlabConfig``
(resolve.py), whose ``engine`` part is what a Simulation reads (engine.py).

    from kvlab.config import resolve
    config = resolve(model="llama-3.1-8b", gpu="h100-sxm", rate=2.0)
    config.key, config.to_dict(), config.engine.cache.num_gpu_blocks
"""

from kvlab.config.engine import (
    GIB,
    CacheConfig,
    ModelConfig,
    SchedulerConfig,
    SimConfig,
    check_block_size,
    min_num_gpu_blocks,
)
from kvlab.config.options import OPTIONS, Option
from kvlab.config.resolve import (
    CostConfig,
    DeviceConfig,
    KvlabConfig,
    ParallelConfig,
    RouterConfig,
    WorkloadConfig,
    resolve,
)

__all__ = [
    "GIB", "OPTIONS", "CacheConfig", "CostConfig", "DeviceConfig", "KvlabConfig", "ModelConfig", "Option",
    "ParallelConfig", "RouterConfig", "SchedulerConfig", "SimConfig", "WorkloadConfig", "check_block_size", "min_num_gpu_blocks",
    "resolve",
]
