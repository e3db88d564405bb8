"""Sandbox service settings (environment variables ``SANDBOX_*``)."""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from arbiter.services.common.settings import ServiceSettings
from arbiter.services.sandbox import memory


def _default_python() -> str:
    # Debian's interpreter lives under /usr, which the sandbox binds read-only anyway.
    return "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"


class SandboxSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SANDBOX_")

    port: int = Field(default=8004, ge=1, le=65535, description="Bind port.")
    bwrap: str = Field(default="bwrap", description="The bubblewrap binary (Debian: bubblewrap).")
    python: str = Field(
        default_factory=_default_python,
        description="The interpreter programs run under (its prefix is bound read-only; its "
        "site-packages are hidden: programs get the standard library only).",
    )
    workers: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        le=256,
        description="Programs running at once (default: CPU count).",
    )
    spare: int = Field(
        default=2,
        ge=0,
        le=256,
        description="Sandboxes started ahead beyond `workers`, waiting for a program.",
    )
    uid: int = Field(
        default=65534,
        ge=1,
        description="When the service runs as root, sandboxes run as this user (nobody): "
        "the kernel enforces the process limit only for a user other than root.",
    )
    gid: int = Field(default=65534, ge=1, description="Group of the sandboxes (see uid).")
    test_timeout_s: float = Field(
        default=10.0, gt=0, le=60, description="The most a test (or a grade call) may ask for."
    )
    item_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="Wall-clock limit of one response's whole run (all its tests); tests not "
        "reached by then fail with 'not run: out of time'.",
    )
    queue_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="How long a response may wait for a free sandbox; past it: null "
        "'timeout' (retryable).",
    )
    memory_mb: int = Field(
        default=2560,
        ge=256,
        le=1 << 20,
        description="Memory of one code_tests sandbox: all of a response's processes together "
        "and its /tmp. Each process gets RLIMIT_AS (memory_mb - tmp_mb - 256) / "
        "(max_processes + 1): 248 MB by default (memory.py).",
    )
    grader_packages: bool = Field(
        default=True,
        description="Bind python_grader's packages (numpy, scipy, …) read-only into every "
        "sandbox; false: graders get the standard library only, and each job's mount "
        "namespace copies ~44 fewer mounts.",
    )
    grader_memory_mb: int = Field(
        default=4096,
        ge=256,
        le=1 << 20,
        description="Memory of one python_grader sandbox, its processes together and its "
        "/tmp. Each process gets RLIMIT_AS (grader_memory_mb - tmp_mb - 256) / "
        "grader_max_processes: 1888 MB by default, as the packages reserve more address space "
        "than a program needs (deepdiff with numpy and pandas ~1.3 GB; OpenAI's Python graders "
        "get 2 GB).",
    )
    max_processes: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="Processes (and threads) a code_tests program may have at once "
        "(RLIMIT_NPROC); its sandbox's memory is shared among them.",
    )
    grader_max_processes: int = Field(
        default=2,
        ge=1,
        le=1024,
        description="Processes (and threads) a python_grader may have at once; its sandbox's "
        "memory is shared among them.",
    )
    max_file_mb: int = Field(default=16, ge=1, le=4096, description="Largest file (RLIMIT_FSIZE).")
    max_open_files: int = Field(default=64, ge=16, le=4096, description="RLIMIT_NOFILE.")
    tmp_mb: int = Field(default=64, ge=1, le=4096, description="Size of the sandbox's /tmp.")
    tmp_inodes: int = Field(
        default=4096, ge=16, le=1 << 20, description="Files and directories in its /tmp at most."
    )
    output_limit_bytes: int = Field(
        default=1 << 20,
        ge=1024,
        le=1 << 30,
        description="Most bytes a program may print (stdout and stderr, all its tests); past "
        "it, the running and remaining tests fail with 'output limit'.",
    )
    max_tests: int = Field(default=512, ge=1, le=10_000, description="Most tests in a reference.")
    max_items: int = Field(
        default=4096, ge=1, description="Most responses in one request; past it: 413."
    )
    nice: int = Field(
        default=19,
        ge=0,
        le=19,
        description="Niceness of the programs: untrusted code yields the CPU to the "
        "services on the same host.",
    )

    session_max: int = Field(
        default=64,
        ge=0,
        le=100_000,
        description="Live Python interpreters (sessions: the envs service's python tool) at "
        "once, all teams together; past it, opening one is 503 sessions_full (retryable). "
        "0: none are opened.",
    )
    session_per_team: int = Field(
        default=16,
        ge=1,
        le=100_000,
        description="Live interpreters of one team at once; past it, opening another is 429 "
        "session_limit for that team alone (retryable, once one of its sessions is closed or "
        "reaped).",
    )
    session_idle_s: float = Field(
        default=300.0,
        gt=0,
        le=24 * 3600,
        description="A session without a cell this long is closed (its interpreter and every "
        "process it left are killed; its id then answers 404 session_not_found).",
    )
    session_memory_mb: int = Field(
        default=1024,
        ge=256,
        le=1 << 20,
        description="Memory of one session's sandbox: its processes together and its /tmp, "
        "shared out as memory_mb is: each process gets RLIMIT_AS (session_memory_mb - tmp_mb "
        "- 256) / session_max_processes, 176 MB by default.",
    )
    session_max_processes: int = Field(
        default=4,
        ge=2,
        le=1024,
        description="Processes (and threads) of a session at once (RLIMIT_NPROC): its "
        "interpreter takes two while a cell starts (one forks the next), what its cells "
        "start takes the rest.",
    )
    session_output_bytes: int = Field(
        default=16384,
        ge=256,
        le=1 << 20,
        description="Bytes of stdout, and of stderr, a cell's answer holds; past it the "
        "rest is counted (stdout_omitted, stderr_omitted), not sent.",
    )
    session_url: str | None = Field(
        default=None,
        description="This replica's own base URL, sent with each session it opens so that "
        "the session's calls reach the replica holding it behind a load balancer "
        "(Kubernetes: http://$(POD_IP):8004). Unset: callers use the URL they opened it at "
        "(one replica, or sticky routing).",
    )

    @field_validator("session_url", mode="before")
    @classmethod
    def _session_url(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if not isinstance(value, str) or not value.startswith(("http://", "https://")):
            raise ValueError(
                f"{value!r} is not an http(s) URL; set e.g. "
                "SANDBOX_SESSION_URL=http://10.0.3.7:8004 (this replica's own address)"
            )
        return value.rstrip("/")

    @model_validator(mode="after")
    def _check(self) -> SandboxSettings:
        if shutil.which(self.bwrap) is None:
            raise ValueError(
                f"SANDBOX_BWRAP={self.bwrap!r} not found: install bubblewrap "
                "(apt-get install bubblewrap) or point SANDBOX_BWRAP at it"
            )
        if shutil.which(self.python) is None:
            raise ValueError(
                f"SANDBOX_PYTHON={self.python!r} not found: point it at a python3 interpreter"
            )
        graders = ("SANDBOX_GRADER_MEMORY_MB", self.grader_memory_mb, "grader")
        sessions = ("SANDBOX_SESSION_MEMORY_MB", self.session_memory_mb, "session")
        for name, total, kind, processes in (
            ("SANDBOX_MEMORY_MB", self.memory_mb, "tests", self.max_processes),
            (*graders, self.grader_max_processes),
            (*sessions, self.session_max_processes),
        ):
            each = memory.process_mb(total, self.tmp_mb, kind, processes)
            if each < memory.MIN_PROCESS_MB:
                raise ValueError(
                    f"{name}={total} leaves {each} MB to each process of a sandbox (less "
                    f"SANDBOX_TMP_MB={self.tmp_mb} and {memory.HARNESS_MB} MB for its harness, "
                    f"shared by {memory.slots(kind, processes)} processes); the least is "
                    f"{memory.MIN_PROCESS_MB} MB. It bounds the sandbox's processes together: "
                    "raise it, or lower the processes"
                )
        if self.test_timeout_s > self.item_timeout_s:
            raise ValueError(
                f"SANDBOX_TEST_TIMEOUT_S={self.test_timeout_s} is above "
                f"SANDBOX_ITEM_TIMEOUT_S={self.item_timeout_s}: one test could never finish"
            )
        return self


@lru_cache(maxsize=1)
def get_settings() -> SandboxSettings:
    return SandboxSettings()
