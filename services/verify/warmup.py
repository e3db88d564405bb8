"""Imported once in the pool's forkserver: every worker forked from it starts warm.

math-verify builds its LaTeX parser and sympy its caches on first use, 0.1–0.4 s here;
paid once in the forkserver instead of by the first item of every replacement worker
(which would count against that item's deadline).
"""

from arbiter.services.verify.worker import warm_up

warm_up()
