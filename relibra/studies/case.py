"""A simulated case's model: a preset cut to its first MoE layers."""

from __future__ import annotations

import dataclasses

from relibra.cluster import ModelShape, get_model
from relibra.errors import ConfigError


def scaled_model(model: str | ModelShape, layers: int | None) -> ModelShape:
    """Model preset `model` (or the shape), keeping only its first `layers` MoE layers (all when None
    or larger).

    The per-layer balance problem (experts, top-k, hidden sizes) is the preset's; only the number of
    layers summed per step shrinks, which leaves throughput *ratios* between policies comparable.
    """
    shape = model if isinstance(model, ModelShape) else get_model(model)
    if layers is None or layers >= shape.num_layers:
        return shape
    if layers <= 0:
        raise ConfigError(f"layers must be positive, got {layers}")
    return dataclasses.replace(shape, num_layers=int(layers))
