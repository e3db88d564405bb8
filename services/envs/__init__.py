"""The envs service: multi-turn episodes over ORS (docs/services/environments.md)."""
