"""OpenAI graders, run: templating, the metrics, ``calculate_output``, and the engine that
grades a batch of rows with one call per service a grader needs. Pure: the services a
grader reaches (embedding, sandbox, judge) are a ``Backend`` the caller gives (the
scoring core's, ``services/scoring/grading.py``). docs/services/graders.md says what each type
does and where it differs from OpenAI's."""
