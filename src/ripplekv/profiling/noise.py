"""The perturbation of sensitivity profiling: norm-adaptive noise on one layer's cached Values.

Each cached value vector ``v`` of the perturbed layer becomes ``v + alpha * ||v|| * u`` with ``u`` uniform on
the unit sphere (RippleKV paper, 2026, step 1), so every layer is perturbed in proportion to its own value
magnitudes. Draws are seeded per (seed, sample, layer) and made in float32 by a CPU generator, so a profile does
not depend on the device or on the order in which layers are processed: a GPU's generator draws other numbers
from the same seed. The draw is the only tensor made on the CPU; it is copied to the values' device once per
(sample, layer), where the norms and the noise are computed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from ripplekv.models.cache import KVPair, PreallocatedLayer, cache_from_layers


def norm_adaptive_noise(values: torch.Tensor, alpha: float, generator: torch.Generator) -> torch.Tensor:
    """Noise ``alpha * ||v|| * u`` for every vector ``v`` along the last dimension of ``values``.

    ``u`` is uniform on the unit sphere (a normalised Gaussian), drawn in float32 on ``generator``'s device (the
    CPU for :func:`noise_generator`, so that draws do not depend on the device) and moved to ``values``' device;
    the norms and the product are computed there, in float32, then cast to ``values``' dtype.

    Args:
        values: the cached values, any shape ``(..., dim)``, any device and float dtype.
        alpha: relative noise scale (``>= 0``).
        generator: the generator of the draw (see :func:`noise_generator`).
    """
    gauss = torch.randn(values.shape, generator=generator, dtype=torch.float32, device=generator.device)
    unit = gauss / gauss.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    norms = values.detach().float().norm(dim=-1, keepdim=True)
    return (alpha * norms * unit.to(values.device)).to(values.dtype)


def noise_generator(seed: int, sample: int, layer: int) -> torch.Generator:
    """The noise generator of one (seed, sample, layer): independent streams, reproducible anywhere.

    Args:
        seed: the profiling seed.
        sample: index of the calibration sample.
        layer: index of the perturbed layer.
    """
    state = np.random.SeedSequence([seed, sample, layer]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class ContinuationBuffers:
    """The prefilled context of every layer, in buffers with room for the continuation, ``batch`` rows each.

    Built once per sample. Clean and perturbed passes get caches of :class:`PreallocatedLayer` views over
    these buffers, so a pass writes its continuation tokens in place instead of concatenating a copy of the
    whole context into every layer. Keys are never written before the prefix end; a perturbed pass reads
    the noisy Values of its layer from a separate buffer, so every clean tensor stays bit-identical.

    Memory: ``batch + 1`` times the context's KV cache (the buffers plus one noisy Value buffer per shape).

    Args:
        clean: the prefilled ``(keys, values)`` of every layer, batch 1.
        room: number of continuation tokens the buffers must hold after the context.
        batch: rows of every buffer.
    """

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

    def clean_cache(self) -> DynamicCache:
        """A batch-1 cache over row 0 of the clean buffers."""
        return cache_from_layers([PreallocatedLayer(k[:1], v[:1], self.prefix) for k, v in zip(self.keys, self.values)])

    def perturbed_cache(
        self, layer: int, alpha: float, generator: torch.Generator, clean_rows: int = 0
    ) -> DynamicCache:
        """A batch cache in which only layer ``layer``'s context Values carry noise (one draw per noisy row).

        Args:
            layer: the perturbed layer.
            alpha: relative noise scale.
            generator: noise generator; the draw has the shape of the noisy rows' context Values, so it is the
                same draw whatever ``clean_rows`` is.
            clean_rows: the first ``clean_rows`` rows keep the clean Values (a reference computed in the same
                batch, by the same arithmetic, as the noisy rows); the others are noisy.
        """
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
