"""Answer-only outcome reward (math_reward) and trajectory quality signals (quality)."""
