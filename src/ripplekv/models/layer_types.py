"""Which decoder layers attend through a sliding window, and which ones a press compresses: like kvpress for Gemma 3,
the global layers only (sliding layers keep their cache; schedules spread the budget over the global layers)."""

from __future__ import annotations

from transformers import PretrainedConfig

SLIDING_LAYER_TYPES = ("sliding_attention", "chunked_attention")
"""``config.layer_types`` entries of layers that attend to a bounded span of recent positions."""


class NoGlobalLayersError(ValueError):
    """Every layer of the model attends through a sliding window: there is no layer to compress."""


def sliding_layers(config: PretrainedConfig) -> tuple[bool, ...]:
    """Per decoder layer, whether it attends through a sliding window (the text config's ``layer_types``; without
    them, every layer when ``sliding_window`` is set, as in Mistral v0.1)."""
    text = config.get_text_config()
    n_layers = int(text.num_hidden_layers)
    types = getattr(text, "layer_types", None)
    if types is not None:
        if len(types) != n_layers:
            raise ValueError(f"config has {len(types)} layer_types for {n_layers} layers")
        return tuple(kind in SLIDING_LAYER_TYPES for kind in types)
    return (getattr(text, "sliding_window", None) is not None,) * n_layers


def compressed_layers(config: PretrainedConfig) -> tuple[int, ...]:
    """Indices of the layers a press compresses: the global (not sliding-window) layers, in order."""
    layers = tuple(i for i, sliding in enumerate(sliding_layers(config)) if not sliding)
    if not layers:
        raise NoGlobalLayersError(
            "every layer attends through a sliding window; ripplekv compresses only global layers: nothing to compress"
        )
    return layers
