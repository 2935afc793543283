"""Counter-based uniforms: the draw for (stream key, step, slot) is a pure function of the three.

The simulator draws MTP draft acceptance per decode step and per decode of the batch. With a
sequential generator a plan priced for k steps and then cut after n (an arrival interrupts it)
would have consumed the draws of the steps that never ran. Here a draw depends only on the
step's index, so a cut plan, a plan stopped by ``stop_at`` and k single-step plans all read the
same numbers, and nothing needs rewinding.

The function is SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014; the finaliser is Stafford's "Mix13"): output number ``c`` of the
stream seeded ``key`` is ``mix(key + (c + 1) * gamma)``, which is counter-based by
construction and vectorises over numpy uint64 arrays (wrapping arithmetic).
"""

from __future__ import annotations

import numpy as np

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SLOT_BITS = np.uint64(24)   # up to 16M decodes per step; steps up to 2**40


_SLOT_TERMS = np.arange(1024, dtype=np.uint64) * _GAMMA   # slot * gamma, grown on demand


def uniforms(key: int, first_step: int, steps: int, slots: int) -> np.ndarray:
    """``u[j, i]`` in [0, 1) for step ``first_step + j`` and slot ``i`` of the stream ``key`` (float64,
    53 random bits each): SplitMix64 output number ``(step << 24) | slot``, computed in place."""
    global _SLOT_TERMS
    if slots > len(_SLOT_TERMS):
        _SLOT_TERMS = np.arange(slots, dtype=np.uint64) * _GAMMA
    step = np.arange(first_step, first_step + steps, dtype=np.uint64)
    # key + (counter + 1) * gamma, with counter = step << 24 | slot = step * 2**24 + slot
    row = (step << _SLOT_BITS) * _GAMMA + np.uint64((key + int(_GAMMA)) % (1 << 64))
    z = row[:, None] + _SLOT_TERMS[None, :slots]
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    z >>= np.uint64(11)
    u = z.astype(np.float64)
    u *= 1.0 / (1 << 53)
    return u
