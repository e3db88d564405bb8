"""The code that runs inside the sandbox, the jail's side of the service.

Rule: **standard library only, no import of the service.** These modules run in the
sandbox's interpreter (``-I -S``: no site-packages, no environment), which sees the standard
library and nothing of the service's own environment. ``bwrap.py`` reads every module of
this folder, in ``bwrap.PARTS`` order, and joins them into one program: it drops their
``__future__`` imports and their imports of each other (those are for the service, its
tools and tests, which also import these modules as ordinary ones), and compiles the rest
as written. An import of anything else would fail in the sandbox; lighter is better too,
as every job's processes are forks of a zygote that imported all of it
(``tests/services/sandbox/test_injail.py`` checks the rule).

The parts: ``harness`` (each job's plumbing: children, pipes, limits, the answer),
``zygote`` (the sandbox's first process, one job at a time), ``runners`` (what each kind of
job does), for Python tests ``checking`` (the job seen from its PID 1), ``checker``
(runs the tests), ``candidate`` (runs the program) and ``wire`` (the values between them),
and for a live interpreter ``session`` (its PID 1) and ``repl`` (the interpreter).
"""
