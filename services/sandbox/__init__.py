"""Sandbox service: untrusted code (``code_tests``, ``python_grader``) under bubblewrap."""
