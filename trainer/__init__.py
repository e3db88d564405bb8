"""GRPO trainer against the Arbiter reward gateway."""
