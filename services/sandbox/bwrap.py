"""A sandbox's command line: ``bwrap`` around an interpreter that boots the harness.

``bwrap_argv`` builds the namespaces, mounts and environment that ``jail.py`` describes;
``compiled_harness`` is what the interpreter reads first (``BOOT``): the modules of
``injail/`` (``PARTS``) as one program, compiled once by the same interpreter.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
from pathlib import Path

from arbiter.services.sandbox.packages import grader_binds
from arbiter.services.sandbox.settings import SandboxSettings

INJAIL = Path(__file__).parent / "injail"  # the code that runs inside: standard library only
# its modules, in this order: each uses those before
PARTS = (
    "harness",
    "zygote",
    "wire",
    "checker",
    "candidate",
    "checking",
    "repl",
    "session",
    "runners",
)


def _one_program() -> str:
    """The modules of ``injail/`` as one source, in ``PARTS`` order: from each after the
    first, its ``__future__`` import and its imports of the others (for tools and tests)
    dropped, the rest as written."""
    ours = {"__future__", *(f"{__package__}.injail.{part}" for part in PARTS)}
    sources = []
    for k, part in enumerate(PARTS):
        text = (INJAIL / f"{part}.py").read_text()
        lines = text.split("\n")
        for node in ast.parse(text).body if k else []:
            if isinstance(node, ast.ImportFrom) and node.module in ours:
                end = node.end_lineno or node.lineno
                lines[node.lineno - 1 : end] = [""] * (end - node.lineno + 1)
        sources.append("\n".join(lines))
    return "\n".join(sources)


HARNESS = _one_program()
# What the interpreter runs: the harness's code object, compiled once at start-up by the same
# interpreter (compiling its source took ~6 ms of every sandbox's start), read from stdin as
# a length line and the marshalled code; the job follows on the same stdin.
BOOT = (
    "import marshal,sys;b=sys.stdin.buffer;"
    "exec(marshal.loads(b.read(int(b.readline()))),{'__name__':'__main__'})"
)
COMPILE = (
    "import marshal,sys;"
    "sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.read(),'harness','exec')))"
)


def interpreter_paths(python: str) -> tuple[str, str, list[str]]:
    """(the interpreter's real path, its prefix, its site-packages dirs), asked of it."""
    code = (
        "import json, site, sys, sysconfig; p = sysconfig.get_paths(); "
        "print(json.dumps([sys.executable, sys.base_prefix, "
        "sorted({p['purelib'], p['platlib'], *site.getsitepackages()})]))"
    )
    out = subprocess.run(
        [python, "-I", "-c", code], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    exe, prefix, sites = json.loads(out)
    return os.path.realpath(exe), os.path.realpath(prefix), sites


def bwrap_argv(settings: SandboxSettings) -> list[str]:
    """The whole command line of one sandbox."""
    exe, prefix, sites = interpreter_paths(settings.python)
    argv = [
        settings.bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--as-pid-1",
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        path = Path(top)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(top), top]
        elif path.is_dir():
            argv += ["--ro-bind", top, top]
    if not prefix.startswith("/usr/"):
        argv += ["--ro-bind", prefix, prefix]
    for site in sites:  # the service's own packages (and anything else installed) hidden
        if Path(site).is_dir():
            argv += ["--tmpfs", site, "--remount-ro", site]
    # the zygote's /tmp: read-only and empty; each job mounts its own fresh one over it
    argv += ["--size", "4096", "--tmpfs", "/tmp", "--remount-ro", "/tmp"]
    # no /proc: nothing there a program needs, and the runner's memory and fds (/proc/1/mem,
    # /proc/1/fd) stay out of reach without making it undumpable
    argv += ["--dev", "/dev", "--chdir", "/tmp"]
    # python_grader's packages (packages.py), read-only, and one thread each for their libraries
    argv += grader_binds(settings)
    # / and /dev are bwrap's own tmpfs, writable and unbounded unless made read-only: only
    # each job's /tmp (bounded in bytes and inodes) takes writes
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    # the zygote makes each job's namespaces (its /tmp mounted, its loopback up) in its own
    # user namespace; every job drops both (harness.drop_capabilities) before it runs
    argv += ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_NET_ADMIN"]
    argv += ["--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    argv += ["--setenv", "LANG", "C.UTF-8"]
    # one malloc arena for all of a process's threads: each further one reserves 64 MB of
    # address space, which would count against the process's share of the sandbox's memory
    argv += ["--setenv", "MALLOC_ARENA_MAX", "1"]
    return [*argv, "--", exe, "-I", "-S", "-c", BOOT]


def compiled_harness(python: str) -> bytes:
    """The harness compiled by ``python`` (code objects are specific to its version), as
    ``Sandbox`` sends it: a length line, then the marshalled code."""
    code = subprocess.run(  # the configured interpreter, a fixed script
        [python, "-I", "-S", "-c", COMPILE],
        input=HARNESS.encode(),
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    return b"%d\n" % len(code) + code


def setpriv(settings: SandboxSettings) -> list[str]:
    """``setpriv`` (util-linux) switching to ``SANDBOX_UID``/``GID`` with no other groups."""
    found = shutil.which("setpriv")
    if found is None:
        raise RuntimeError(
            "the sandbox service runs as root and needs setpriv (Debian: util-linux) to run "
            "programs as SANDBOX_UID; install it or run the service as another user"
        )
    uid, gid = settings.uid, settings.gid
    return [found, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
