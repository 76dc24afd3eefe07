"""The perturbation of sensitivity profiling: norm-adaptive noise on one layer's cached Values.

Each value vector ``v`` becomes ``v + alpha * ||v|| * u``, ``u`` uniform on the unit sphere (RippleKV paper, 2026,
step 1). Draws are seeded per (seed, sample, layer) on a CPU generator in float32, so a profile depends neither on
the device (a GPU generator draws other numbers) nor on layer order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from ripplekv.models.cache import KVPair, PreallocatedLayer, cache_from_layers


def norm_adaptive_noise(values: torch.Tensor, alpha: float, generator: torch.Generator) -> torch.Tensor:
    """Noise ``alpha * ||v|| * u`` for every vector ``v`` along the last dimension of ``values`` (``u`` drawn in
    float32 on ``generator``'s device; norms and product in float32 on ``values``' device, cast to its dtype)."""
    gauss = torch.randn(values.shape, generator=generator, dtype=torch.float32, device=generator.device)
    unit = gauss / gauss.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    norms = values.detach().float().norm(dim=-1, keepdim=True)
    return (alpha * norms * unit.to(values.device)).to(values.dtype)


def noise_generator(seed: int, sample: int, layer: int) -> torch.Generator:
    """The CPU noise generator of one (seed, sample, layer): independent streams, reproducible anywhere."""
    state = np.random.SeedSequence([seed, sample, layer]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class ContinuationBuffers:
    """The prefilled context of every layer in ``batch``-row buffers with ``room`` tokens for the continuation,
    written in place; noisy Values go to a separate buffer, so every clean tensor stays bit-identical."""

    def __init__(self, clean: Sequence[KVPair], room: int, batch: int) -> None:
        if batch < 1 or room < 0:
            raise ValueError(f"ContinuationBuffers needs batch >= 1 and room >= 0, got batch {batch}, room {room}")
        self.prefix = clean[0][0].shape[-2]
        self.batch = batch
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        for k, v in clean:
            for source, target in ((k, self.keys), (v, self.values)):
                buffer = source.new_empty((batch, *source.shape[1:-2], self.prefix + room, source.shape[-1]))
                buffer[..., : self.prefix, :] = source
                target.append(buffer)
        self._noisy: dict[tuple[int, ...], torch.Tensor] = {}

    def perturbed_cache(
        self, layer: int, alpha: float, generator: torch.Generator, clean_rows: int = 0
    ) -> DynamicCache:
        """A batch cache in which only ``layer``'s context Values carry noise, except in the first ``clean_rows``
        rows (the reference); the draw is the same whatever ``clean_rows`` is."""
        if not 0 <= clean_rows < self.batch:
            raise ValueError(f"clean_rows must be in [0, {self.batch}), got {clean_rows}")
        values = self.values[layer]
        noisy = self._noisy.get(tuple(values.shape))
        if noisy is None:
            noisy = self._noisy.setdefault(tuple(values.shape), torch.empty_like(values))
        context = values[..., : self.prefix, :]
        noisy[:clean_rows, ..., : self.prefix, :] = context[:clean_rows]
        torch.add(
            context[clean_rows:],
            norm_adaptive_noise(context[clean_rows:], alpha, generator),
            out=noisy[clean_rows:, ..., : self.prefix, :],
        )
        layers = [PreallocatedLayer(k, v, self.prefix) for k, v in zip(self.keys, self.values)]
        layers[layer] = PreallocatedLayer(self.keys[layer], noisy, self.prefix)
        return cache_from_layers(layers)
