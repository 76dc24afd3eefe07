"""Shared prefill: one full prefill of a prompt feeds every (method, budget) compressed cache (re-exports).

The code lives by concern in these modules (import from them; this module keeps the old names importable):

* :mod:`ripplekv.inference.hidden_tail`: what a press reads of the hidden states (:func:`hidden_states_needed`,
  :func:`hidden_states_tail`, :data:`DEFAULT_HIDDEN_TAIL`) and which scorers a record prescores
  (:data:`PRESCORABLE`, :func:`prescored_scorers`);
* :mod:`ripplekv.inference.recording_press`: :class:`RecordingPress`, which records per layer what ``compress``
  receives (:class:`LayerRecord`), in one pass or in chunks;
* :mod:`ripplekv.inference.record`: :class:`PrefillRecord`, :func:`record_prefill` (its memory: the full cache and
  a bounded tail of the hidden states) and :func:`residual_statistics_of`;
* :mod:`ripplekv.inference.derive`: which presses are derivable (:func:`is_derivable`, :class:`NotDerivableError`)
  and their caches from a record (:func:`derive_cache`, :func:`compress_recorded`, :func:`derived_prefill`,
  :func:`compressed_prefill_in_chunks`);
* :mod:`ripplekv.inference.lean`: passes over a derived cache that never copy the record (:func:`lean_extend`,
  :func:`lean_teacher_forced_logprobs`, :func:`lean_greedy_decode`; forks of :mod:`ripplekv.models.cache`).
"""

from __future__ import annotations

from ripplekv.inference.derive import (
    NotDerivableError,
    compress_recorded,
    compressed_prefill_in_chunks,
    derive_cache,
    derived_prefill,
    is_derivable,
)
from ripplekv.inference.hidden_tail import (
    DEFAULT_HIDDEN_TAIL,
    HIDDEN_STATES_ATTRIBUTE,
    PRESCORABLE,
    hidden_states_needed,
    hidden_states_tail,
    prescored_scorers,
)
from ripplekv.inference.lean import lean_extend, lean_greedy_decode, lean_teacher_forced_logprobs
from ripplekv.inference.record import PrefillRecord, record_prefill, residual_statistics_of
from ripplekv.inference.recording_press import LayerRecord, RecordingPress
from ripplekv.models.cache import OverlayLayer, lean_fork

__all__ = [
    "DEFAULT_HIDDEN_TAIL",
    "HIDDEN_STATES_ATTRIBUTE",
    "PRESCORABLE",
    "LayerRecord",
    "NotDerivableError",
    "OverlayLayer",
    "PrefillRecord",
    "RecordingPress",
    "compress_recorded",
    "compressed_prefill_in_chunks",
    "derive_cache",
    "derived_prefill",
    "hidden_states_needed",
    "hidden_states_tail",
    "is_derivable",
    "lean_extend",
    "lean_fork",
    "lean_greedy_decode",
    "lean_teacher_forced_logprobs",
    "prescored_scorers",
    "record_prefill",
    "residual_statistics_of",
]
