"""What the compiled sampler compiles, counted on the CPU with a recording backend.

The decode step is compiled as one decoder layer (``decoder.layer_step``, shared by every
layer) plus the head with the draw: a compilation per new (cache, attended length) shape
costs one layer's graph, whatever the depth. Compiling the whole unrolled step instead made
each of a 7B rollout's five attended lengths a compilation of all 28 layers, again for every
new KV-cache size (each batch's longest prompt sets it), and under FSDP2 the other rank
waited for it at the next collective: the first step took 297 s instead of 74 s on two
H200s. The two-rank case (gloo, FSDP2, a training step between rollouts, which moves the
cache and the gathered weights) runs in ``sampler_compile_worker.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from arbiter.procs import free_port
from arbiter.tiny_model import build
from arbiter.trainer.generation import Sampler
from arbiter.trainer.sampling import SamplingParams

HERE = Path(__file__).resolve().parent


class Recorder:
    """A torch.compile backend that runs the graph as traced and keeps its node count."""

    def __init__(self) -> None:
        self.graphs: list[int] = []

    def __call__(self, gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        self.graphs.append(len(gm.graph.nodes))
        return gm.forward


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    rec, real = Recorder(), torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **(kw | {"backend": rec})))
    torch._dynamo.reset()
    yield rec
    torch._dynamo.reset()


def _model(tmp_path: Path, layers: int) -> Any:
    from transformers import AutoModelForCausalLM

    path = build(tmp_path / f"m{layers}", None, layers=layers)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _sample(sampler: Sampler, prompt_len: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 100, (4, prompt_len), generator=gen)
    params = SamplingParams(12, -1, 0, generator=gen)
    return sampler(ids, torch.ones_like(ids), params)[0]


def test_decode_compiles_one_layer_whatever_the_depth(tmp_path: Path, recorder: Recorder) -> None:
    """2 and 4 layers compile the same graphs (one layer per attended length, then the head
    with the draw), and the compiled steps sample what the eager sampler samples."""
    sizes = {}
    for layers in (2, 4):
        model = _model(tmp_path, layers)
        recorder.graphs.clear()
        torch._dynamo.reset()
        got = _sample(Sampler(model, compile=True, length_round=8), 5)
        sizes[layers] = list(recorder.graphs)
        assert torch.equal(got, _sample(Sampler(model, compile=False, length_round=8), 5))
    # prompt 5 + 12 new tokens over 8-slot lengths: the layer at 8 and 16 slots, the head
    assert len(sizes[2]) == 3 and sizes[2].count(max(sizes[2], key=sizes[2].count)) == 2
    assert sizes[2] == sizes[4]


def test_a_rollout_of_known_shapes_compiles_nothing(tmp_path: Path, recorder: Recorder) -> None:
    """The cache freed between calls (keep_cache=False) and allocated anew: no compilation;
    a longer prompt (a new cache size) compiles the layer once per new attended length."""
    sampler = Sampler(_model(tmp_path, 2), compile=True, keep_cache=False, length_round=8)
    _sample(sampler, 5)
    first = len(recorder.graphs)
    _sample(sampler, 5, seed=1)
    assert len(recorder.graphs) == first
    _sample(sampler, 60)  # capacity 64 -> 128 slots; attended 64 and 72
    assert len(recorder.graphs) == first + 2


def test_fsdp_ranks_recompile_nothing_after_a_training_step(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Two gloo ranks, FSDP2: sample (gathered weights), train a step, sample again at the
    same shapes -- the cache and the gathered weights have moved, no new compilation; then a
    new cache size on one rank: one layer graph per new attended length there, none on the
    other."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(free_port()), str(HERE / "sampler_compile_worker.py"),
           str(tiny_model), str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"compiles-{r}.json").read_text()) for r in (0, 1)]
    for r, got in enumerate(ranks):
        first, again, new_size = got["rollouts"]
        layer = max(first, key=first.count)
        assert len(first) == 3 and first.count(layer) == 2, got  # 2 lengths x 1 layer, head
        assert again == [], got  # after the step: cache and weights moved, nothing compiled
        assert new_size == ([layer] * 2 if r == 0 else []), got
