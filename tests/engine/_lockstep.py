"""Drive a single-engine session and a staged one through the same steps, comparing exactly."""

from __future__ import annotations

import numpy as np


def lockstep(one, many, prompts, decode: int) -> None:
    """Drive both sessions through the same prompts (each a sync that may reuse or rebuild) and
    decode steps; compare logits after every step and payloads after every prompt."""
    for k, prompt in enumerate(prompts):
        one.sync(prompt)
        many.sync(prompt)
        assert np.array_equal(one.logits, many.logits), f"prompt {k}"
        assert many.save_payload() == one.save_payload(), f"payload after prompt {k}"
        for i in range(decode):
            t = one.argmax()
            assert many.argmax() == t
            one.eval(t)
            many.eval(t)
            assert np.array_equal(one.logits, many.logits), f"prompt {k} decode step {i}"
        assert many.save_payload() == one.save_payload(), f"payload after decoding prompt {k}"
        assert many.tokens == one.tokens
