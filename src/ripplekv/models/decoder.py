"""Where a causal LM's decoder layers are: ``model.get_decoder().layers`` (``model.model``'s, Gemma 3's
``language_model``'s)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


def find_decoder(model: Any) -> Any:
    """The decoder stack holding a causal LM's ``layers`` (``model.get_decoder()``), None when there is none."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    return decoder if getattr(decoder, "layers", None) is not None else None


def decoder_layers(model: Any) -> list[nn.Module]:
    """The decoder layers of a causal LM, in order; TypeError for a model without them."""
    decoder = find_decoder(model)
    if decoder is None:
        raise TypeError(
            f"cannot find the decoder layers of {type(model).__name__} (expected model.get_decoder().layers)"
        )
    return list(decoder.layers)
