"""Gateway: the public ``POST /v1/score``; expands recipes, fans out to components, caches."""
