"""Embedding service: group diversity and OpenAI-compatible embeddings, dynamically batched."""
