"""Registers the group schemas in Hydra's ConfigStore (``base_<group>``)."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from sweepbench.config.schema import (
    BackendConfig,
    ModeConfig,
    ModelConfig,
    ParallelismConfig,
    SweepbenchConfig,
)


def store_schemas() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=SweepbenchConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="parallelism", name="base_parallelism", node=ParallelismConfig)
    cs.store(group="backend", name="base_backend", node=BackendConfig)
    cs.store(group="mode", name="base_mode", node=ModeConfig)


def store_benchmark_schema(name: str, node: type) -> None:
    """Each benchmark module stores its own schema as ``benchmark/base_<name>``."""
    ConfigStore.instance().store(group="benchmark", name=f"base_{name}", node=node)
