"""KV-cache presses: RippleKV and one name per method."""

from ripplekv.presses.full_press import FullPress
from ripplekv.presses.registry import METHODS, make_press
from ripplekv.presses.ripplekv_press import RippleKVPress

__all__ = ["METHODS", "FullPress", "RippleKVPress", "make_press"]
