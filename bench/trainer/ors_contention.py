"""Where a step's seconds go when the episodes run through the environments service.

The trainer's GPU phases (sampling, log-probs) of the 4.7 M-parameter model are bound by the
host launching kernels: every torch op releases the GIL and takes it back. This probe times
those phases of a model of the same shape on the CPU (eager, op by op, as bound by the host
as the GPU's launches are) alone, and beside ``env=ors`` traffic -- the trainer's own episode
flow (open, a calculator call, submit, delete) for a batch of episodes, round after round --
in two places:

- ``threads``: ``trainer.ors``'s client on threads of the probe's process (the trainer's
  layout);
- ``process``: the same traffic from a child process (no GIL shared with the probe).

The probe's thread runs on core 0; the services, the traffic's threads and the child on the
other cores, so the only thing ``threads`` shares with the probe that ``process`` does not is
the GIL. It prints one JSON document: the phases' seconds per round and the traffic's
episodes and requests per second in each case, and the client's CPU per request.

    python -m bench.trainer.ors_contention [--episodes 512] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from arbiter.trainer.data import Problem

PROBE_CORE = 0
CORES = frozenset(os.sched_getaffinity(0))  # as the process started
OTHERS = (CORES - {PROBE_CORE}) or CORES


def _model() -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval()


def _schedstat() -> tuple[float, float]:
    """This thread's seconds on a core and waiting for one (Linux ``schedstat``)."""
    with open("/proc/thread-self/schedstat") as f:
        on_cpu, queued, _ = f.read().split()
    return int(on_cpu) / 1e9, int(queued) / 1e9


def _phases(model: Any, rounds: int) -> dict[str, float]:
    """Per round: seconds of sampling (16 rows, 32 new tokens) and of a log-prob forward
    (small enough that the ops' dispatch, not their arithmetic, bounds them, as the GPU's
    launches bound the trainer's), and how the thread spent them: on a core, waiting for a
    core (other processes' load), or neither -- blocked, which for this thread (no I/O) is
    waiting for the GIL."""
    from arbiter.trainer.generation import Sampler
    from arbiter.trainer.sampling import SamplingParams

    sampler = Sampler(model)
    ids = torch.randint(3, 2048, (16, 48), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    params = SamplingParams(max_new_tokens=32, eos_token_id=1, pad_token_id=0)
    gen = fwd = 0.0
    cpu0, queued0 = _schedstat()
    wall0 = time.perf_counter()
    for _ in range(rounds):
        t = time.perf_counter()
        out, _ = sampler(ids, mask, params)
        gen += time.perf_counter() - t
        t = time.perf_counter()
        with torch.no_grad():
            model(torch.cat([ids, out], dim=1)).logits.float().log_softmax(-1)
        fwd += time.perf_counter() - t
    wall = time.perf_counter() - wall0
    cpu, queued = (b - a for a, b in zip((cpu0, queued0), _schedstat(), strict=True))
    return {
        "generate_s": gen / rounds,
        "logprobs_s": fwd / rounds,
        "on_cpu_s": cpu / rounds,
        "core_wait_s": queued / rounds,
        "gil_wait_s": (wall - cpu - queued) / rounds,
    }


def _rounded(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in d.items()}


def _problems(n: int) -> list[Problem]:
    return [
        Problem(id=f"p{i}", question=f"What is {i} * 7?", reference=str(i * 7)) for i in range(n)
    ]


def _episodes(url: str, n: int, stop: Any, counts: Any, cores: set[int]) -> None:
    """Rounds of the trainer's flow for ``n`` episodes until ``stop`` is set, on ``cores``."""
    os.sched_setaffinity(0, cores)
    from arbiter.trainer.ors import OrsEnvironments

    ors = OrsEnvironments("ors:calculator", url)  # its threads inherit this one's cores
    tasks = _problems(n)
    started = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = started.ru_utime + started.ru_stime  # after the imports
    try:
        while not stop.is_set():
            batch = ors.batch()
            batch.reset(tasks)
            batch.step({i: (f"<calc>{i} * 7</calc>", False) for i in range(n)})
            batch.step({i: (f"<answer>{i * 7}</answer>", True) for i in range(n)})
            batch.rewards().result()
            with counts.get_lock():
                counts[0] += n
    finally:
        ors.pool.shutdown()  # the last deletes
        ors.close()
    used = resource.getrusage(resource.RUSAGE_SELF)
    with counts.get_lock():
        counts[1] += used.ru_utime + used.ru_stime - cpu0


def _beside(model: Any, url: str, n: int, seconds: float, mode: str) -> dict[str, Any]:
    """The phases measured while ``n`` episodes run round after round (``mode``)."""
    counts = mp.get_context("spawn").Array("d", 2)
    if mode == "process":
        ctx = mp.get_context("spawn")
        stop: Any = ctx.Event()
        worker: Any = ctx.Process(target=_episodes, args=(url, n, stop, counts, set(OTHERS)))
    else:
        stop = threading.Event()
        worker = threading.Thread(target=_episodes, args=(url, n, stop, counts, set(OTHERS)))
    worker.start()
    time.sleep(3)  # the first round under way
    t0, done0, client0 = time.perf_counter(), counts[0], _threads_cpu()
    rounds, phases = 0, dict.fromkeys(_phases(model, 1), 0.0)
    while time.perf_counter() - t0 < seconds:
        got = _phases(model, 1)
        rounds += 1
        for k in phases:
            phases[k] += got[k]
    wall, episodes, client = time.perf_counter() - t0, counts[0] - done0, _threads_cpu() - client0
    stop.set()
    worker.join()
    out: dict[str, Any] = {k: round(v / rounds, 4) for k, v in phases.items()}
    out["episodes_per_s"] = round(episodes / wall, 1)
    if mode == "process":  # the child's, over all its rounds
        client, episodes = counts[1], counts[0]
    out["client_cpu_ms_per_episode"] = round(1000 * client / max(1, episodes), 2)
    return out


def _threads_cpu() -> float:
    """Seconds on a core of this process's threads but the probe's (the traffic's)."""
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == threading.get_native_id():
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0]) / 1e9
        except OSError:  # the thread ended meanwhile
            continue
    return total


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--episodes", type=int, default=512)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--modes", default="threads,process")
    a = p.parse_args(argv)
    from bench.trainer.learn import _services

    os.sched_setaffinity(0, OTHERS)  # the services inherit the other cores
    work = Path(tempfile.mkdtemp(prefix="ors-contention-"))
    procs, url = _services(work, 1, ors=True)
    os.sched_setaffinity(0, {PROBE_CORE})
    torch.set_num_threads(1)
    try:
        model = _model()
        _phases(model, 2)  # warm
        res: dict[str, Any] = {
            "alone": _rounded(_phases(model, 10)),
            "episodes": a.episodes,
            "cores": len(CORES),
        }
        for mode in a.modes.split(","):
            res[mode] = _beside(model, url, a.episodes, a.seconds, mode)
            res["alone_after_" + mode] = _rounded(_phases(model, 5))
    finally:
        for proc in procs:
            proc.stop()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
