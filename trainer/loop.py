"""GRPO training loop, top to bottom: rollout, reward, advantage, loss, step.

Algorithm (per step, per rank): sample B prompts, G completions each (temperature
sampling, left-padded prompts, stop at EOS; or G multi-turn trajectories in a tool
environment); send each group to the gateway (``POST /v1/score``) in the background;
meanwhile compute the behaviour log-probs (when mu > 1 or pipelining) and the frozen
reference's log-probs (when beta > 0); wait for the rewards; A = (r - mean_g) /
(std_g + eps) over non-null rewards; minimise the clipped surrogate (eps_low, eps_high)
+ beta * k3 KL for mu passes; AdamW step with warm-up and gradient clipping.

With ``pipeline=true`` batch k+1 is generated while batch k's rewards are in flight;
batch k is then trained one update later than it was sampled, and the importance ratio
against its behaviour log-probs corrects for that. Everything the loop uses is built
once by ``trainer.run.build_run``.

    python -m arbiter.trainer --config configs/tiny-cpu.yaml model=/tmp/tiny steps=20
    torchrun --nproc_per_node 2 -m arbiter.trainer --config configs/qwen2.5-1.5b-gsm8k.yaml
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.contrib.logging import logging_redirect_tqdm

from arbiter.proto.gateway import ScoreGroup
from arbiter.trainer.config import RunError, TrainerConfig
from arbiter.trainer.data import batch_indices
from arbiter.trainer.env import rollout_batch
from arbiter.trainer.evaluate import evaluate
from arbiter.trainer.grpo import group_advantages
from arbiter.trainer.metrics import plot_curves, reduce_record, run_summary, step_metrics
from arbiter.trainer.ors import episode_rewards_later
from arbiter.trainer.parallel import gathered
from arbiter.trainer.rewards import BatchRewards, RewardsUnavailable
from arbiter.trainer.rollout import Rollout, sequence_logprobs
from arbiter.trainer.run import Run, build_run
from arbiter.trainer.update import train_on_batch

log = logging.getLogger("trainer")


def train(cfg: TrainerConfig) -> dict[str, Any]:
    """Run GRPO as ``cfg`` says; returns the last step's (rank-averaged) metrics.

    Steps are counted from 1 everywhere (log lines, warnings, metrics.jsonl, checkpoint
    names): step n is the n-th optimizer update; eval "at step n" follows it (0: before any).
    """
    run = build_run(cfg)
    # log lines go above the progress bar (tqdm.write), never glued to it
    with logging_redirect_tqdm(), contextlib.closing(run):  # rewards thread and bar closed
        summary = _loop(run)
    run.dist.barrier()
    if run.dist.main:
        log.info("%s", run_summary(run.run_dir, plotted=cfg.plot))
    return summary


def _loop(run: Run) -> dict[str, Any]:
    cfg, dist, device = run.cfg, run.dist, run.device
    if cfg.eval_every and run.start_step == 0:
        run_eval(run, 0)
    summary: dict[str, Any] = {}
    t_first = time.perf_counter()
    pending = produce(run, run.start_step) if cfg.pipeline else None
    for step in range(run.start_step, cfg.steps):
        t_step = t_first if step == run.start_step else time.perf_counter()
        if device.type == "cuda" and step > run.start_step:  # the first step's peak from the start
            torch.cuda.reset_peak_memory_stats(device)
        # 1-2. Rollout, then reward requests in the background (pipelined: batch k+1 is
        # sampled while batch k is scored, and trained one update after it was sampled)
        if pending is None:
            current = made = produce(run, step)
        else:
            current = pending
            pending = produce(run, step + 1) if step + 1 < cfg.steps else None
            made = _pipelined_share(current, pending, first=step == run.start_step)

        # 3. Wait for the rewards; a gateway outage skips the batch on every rank
        t_wait = time.perf_counter()
        result = wait_for_rewards(run, current, step)
        wait_s = time.perf_counter() - t_wait
        if result is None:
            continue

        # 4. Advantages: group-normalised over non-null rewards; null rewards -> A = 0
        r = torch.tensor(result.flat(), dtype=torch.float32)  # (S,), NaN where null
        adv = group_advantages(r, cfg.group_size, scale=cfg.scale_rewards, eps=cfg.adv_eps)

        # 5. Loss and optimizer step: mu passes over the batch, micro-batches accumulated
        t_train = time.perf_counter()
        roll = current.rollout
        stats = train_on_batch(cfg, run.model, run.opt, roll, adv.to(device), dist, run.precision)
        run.sched.step()
        # the gradients are not read again before the next backward: their memory (a whole
        # fp32 model's worth, unsharded) goes to the next rollout's gathered weights and KV cache
        run.opt.zero_grad(set_to_none=True)
        train_s = time.perf_counter() - t_train

        # 6. Log, evaluate, checkpoint
        step_s = time.perf_counter() - t_step
        record = step_metrics(result, r, cfg.group_size, roll, stats)
        record.update(
            {
                "step": step + 1,
                "lr": run.sched.get_last_lr()[0],
                "time/generate": made.gen_s,
                "time/logprobs": made.logp_s,
                "time/reward_wait": wait_s,
                "time/train": train_s,
                "time/step": step_s,
                "time/reward_latency": result.elapsed_s,
                "reward_wait_frac": wait_s / step_s,
                "tokens_per_s": roll.action_tokens / step_s,
                "tokens/sequence": float(roll.input_ids.numel()),  # prompt + completion, padded
                "decode_steps": float(roll.n_completion),
                **_memory(device),
            }
        )
        summary = reduce_record(record, dist, device)
        run.logger.step(summary)
        if step + 1 < cfg.steps:
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0:
                run_eval(run, step + 1)
            if cfg.save_every > 0 and (step + 1) % cfg.save_every == 0:
                run.save(step + 1)

    if cfg.eval_every:
        run_eval(run, cfg.steps)
    if cfg.save_every >= 0:
        run.save(cfg.steps)
    if dist.main and cfg.plot:
        plot_curves(run.run_dir)
    return summary


def _memory(device: torch.device) -> dict[str, float]:
    """This rank's peak GPU memory over the step (the rollout it trained on included), GiB."""
    if device.type != "cuda":
        return {}
    return {
        "mem/peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
        "mem/peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
    }


@dataclass
class Pending:
    """A sampled batch whose rewards are being computed."""

    rollout: Rollout
    rewards: Future[BatchRewards]
    gen_s: float  # sampling time
    logp_s: float  # behaviour/reference log-prob time


def produce(run: Run, step: int) -> Pending:
    """Rollout with the current policy, send the groups for scoring, then compute the
    behaviour/reference log-probs while the requests are in flight."""
    cfg, G = run.cfg, run.cfg.group_size
    t0 = time.perf_counter()
    idx = batch_indices(
        len(run.problems),
        seed=cfg.seed,
        step=step,
        rank=run.dist.rank,
        world=run.dist.world,
        per_rank=cfg.prompts_per_step,
    )
    batch = [run.problems[i] for i in idx]
    with gathered(run.policy):  # FSDP2: the whole model on every rank for the rollout
        roll = rollout_batch(
            run.sampler, run.tokenizer, batch, run.spec, run.sampling_for(step), run.ors
        )
    gen_s = time.perf_counter() - t0
    groups = [
        ScoreGroup(
            id=p.id,
            prompt=p.question,
            reference=p.reference,
            responses=roll.texts[g * G : (g + 1) * G],
        )
        for g, p in enumerate(batch)
    ]
    if roll.env_rewards is not None:  # the episodes' own rewards, from the service
        future = episode_rewards_later(groups, roll.env_rewards, cfg.env)
    else:
        future = run.rewards.submit(cfg.recipe, groups)
    t1 = time.perf_counter()
    mbs, chunk = cfg.micro_batch_size, cfg.logprob_chunk_tokens
    if cfg.mu > 1 or cfg.pipeline:  # else the ratio is exactly 1: reuse detached log-probs
        roll.old_logps = sequence_logprobs(
            run.policy, roll, mbs, run.precision, chunk, shared_prefix=cfg.shared_prefix
        )
    if run.ref is not None:
        roll.ref_logps = sequence_logprobs(
            run.ref, roll, mbs, run.precision, chunk, shared_prefix=cfg.shared_prefix
        )
    return Pending(roll, future, gen_s, time.perf_counter() - t1)


def _pipelined_share(current: Pending, pending: Pending | None, first: bool) -> Pending:
    """Sampling time spent in this iteration: the next batch's (+ the first batch's, once)."""
    gen_s = (current.gen_s if first else 0.0) + (pending.gen_s if pending else 0.0)
    logp_s = (current.logp_s if first else 0.0) + (pending.logp_s if pending else 0.0)
    return Pending(current.rollout, current.rewards, gen_s, logp_s)


def wait_for_rewards(run: Run, pending: Pending, step: int) -> BatchRewards | None:
    """The batch's rewards, or None when any rank got none (the batch is skipped)."""
    result: BatchRewards | None = None
    try:
        result = pending.rewards.result()
    except RewardsUnavailable as e:
        log.warning("step %d: batch skipped, no rewards: %s", step + 1, e)
    if run.dist.any(result is None, run.device):
        run.skipped_in_row += 1
        run.logger.write({"kind": "skip", "step": step + 1, "reason": "rewards unavailable"})
        if run.skipped_in_row > run.cfg.max_skipped_batches:
            raise RunError(
                f"{run.skipped_in_row} batches in a row without rewards: "
                f"is the gateway at {run.cfg.gateway_url} up? (`arbiter up` starts one; "
                "resume=true continues from the last checkpoint)"
            )
        return None
    assert result is not None
    run.skipped_in_row = 0
    for kind, n in result.error_kinds().items():
        if kind not in run.seen_error_kinds:  # say it once per kind; counts go to the metrics
            run.seen_error_kinds.add(kind)
            log.warning(
                "step %d: %d null reward(s) of kind %r (masked, advantage 0): %s",
                step + 1, n, kind, result.first_reason(kind),
            )  # fmt: skip
    if result.fingerprint != run.fingerprint:
        if run.fingerprint:
            log.warning(
                "step %d: recipe fingerprint changed: %s -> %s",
                step + 1, run.fingerprint, result.fingerprint,
            )  # fmt: skip
        run.fingerprint = result.fingerprint
        run.logger.write(
            {
                "kind": "recipe",
                "step": step + 1,
                "recipe": result.recipe_name,
                "fingerprint": result.fingerprint,
            }
        )
    return result


def run_eval(run: Run, step: int) -> None:
    try:
        m = evaluate(run)
    except RewardsUnavailable as e:
        log.warning("evaluation at step %d skipped: %s", step, e)
        return
    run.logger.write({"kind": "eval", "step": step, **m})
    if run.dist.main:
        log.info(
            "eval step %d: accuracy %.3f over %d problems",
            step,
            m["eval/accuracy"],
            len(run.eval_problems),
        )
