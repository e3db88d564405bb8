"""Judge service: LLM-as-judge rewards (rubric quality, Yes/No verifier probability)."""
