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
against its behaviour log-probs corrects for that.

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

from arbiter.proto.gateway import ScoreGroup
from arbiter.trainer import checkpoint
from arbiter.trainer.config import TrainerConfig
from arbiter.trainer.data import batch_indices, load_problems
from arbiter.trainer.env import rollout_batch
from arbiter.trainer.evaluate import evaluate
from arbiter.trainer.grpo import build_optimizer, group_advantages
from arbiter.trainer.metrics import RunLogger, plot_curves, reduce_record, step_metrics
from arbiter.trainer.rewards import BatchRewards, RewardClient, RewardsUnavailable
from arbiter.trainer.rollout import Rollout, sequence_logprobs
from arbiter.trainer.setup import (
    init_distributed,
    load_model,
    load_tokenizer,
    prepare_run_dir,
    resolve_precision,
    setup_logging,
)
from arbiter.trainer.update import train_on_batch

log = logging.getLogger("trainer")


@dataclass
class Pending:
    """A sampled batch whose rewards are being computed."""

    rollout: Rollout
    rewards: Future[BatchRewards]
    gen_s: float
    logp_s: float


def train(cfg: TrainerConfig) -> dict[str, Any]:
    dist, device = init_distributed(cfg.device, cfg.cpu_threads)
    setup_logging(dist.main)
    precision = resolve_precision(cfg.precision, device)
    run_dir = prepare_run_dir(cfg, dist)
    if dist.main:
        log.info(
            "config (saved to %s):\n%s",
            run_dir / "config.yaml",
            (run_dir / "config.yaml").read_text(),
        )
    torch.manual_seed(cfg.seed + dist.rank)

    # --- models: the policy (from the latest checkpoint when resuming), the frozen reference
    resume_from = checkpoint.latest(run_dir) if cfg.resume else None
    if cfg.resume and resume_from is None:
        log.warning("resume=true but %s holds no complete checkpoint: starting at step 0", run_dir)
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(
        resume_from or cfg.model,
        device,
        precision,
        trainable=True,
        gradient_checkpointing=cfg.gradient_checkpointing,
    )
    ref = load_model(cfg.model, device, precision, trainable=False) if cfg.beta > 0 else None
    model: Any = policy
    if dist.enabled:
        ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(policy, device_ids=ids)
    opt, sched = build_optimizer(
        policy,
        lr=cfg.lr,
        betas=(cfg.adam_betas[0], cfg.adam_betas[1]),
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_steps,
    )
    start_step, fingerprint = 0, ""
    if resume_from is not None:
        state = checkpoint.load_state(resume_from)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start_step, fingerprint = int(state["step"]), state.get("recipe_fingerprint", "")
        log.info("resumed from %s at step %d", resume_from, start_step)

    # --- data, rewards, environment, logging
    problems = load_problems(f"{cfg.data_dir}/{cfg.train_file}", cfg.max_train_problems)
    eval_problems = (
        load_problems(f"{cfg.data_dir}/{cfg.eval_file}", cfg.eval_problems)
        if cfg.eval_every
        else []
    )
    rewards = RewardClient(
        cfg.gateway_url,
        concurrency=cfg.reward_concurrency,
        timeout_s=cfg.reward_timeout_s,
        retries=cfg.reward_retries,
        backoff_s=cfg.reward_backoff_s,
        api_key=cfg.api_key,
    )
    logger = RunLogger(
        run_dir,
        total_steps=cfg.steps,
        start_step=start_step,
        enabled=dist.main,
        progress=cfg.progress,
    )
    G = cfg.group_size
    need_old = cfg.mu > 1 or cfg.pipeline  # else the ratio is exactly 1: reuse detached log-probs

    def run_eval(step: int) -> None:
        try:
            m = evaluate(cfg, policy, tokenizer, eval_problems, rewards, dist, device, precision)
        except RewardsUnavailable as e:
            log.warning("evaluation at step %d skipped: %s", step, e)
            return
        logger.write({"kind": "eval", "step": step, **m})
        if dist.main:
            log.info(
                "eval step %d: accuracy %.3f over %d problems",
                step,
                m["eval/accuracy"],
                len(eval_problems),
            )

    def produce(step: int) -> Pending:
        """1. Rollout with the current policy, 2. send the groups for scoring, then compute
        behaviour/reference log-probs while the requests are in flight."""
        t0 = time.perf_counter()
        batch = [
            problems[i]
            for i in batch_indices(
                len(problems),
                seed=cfg.seed,
                step=step,
                rank=dist.rank,
                world=dist.world,
                per_rank=cfg.prompts_per_step,
            )
        ]
        gen = torch.Generator(device).manual_seed(cfg.seed * 1_000_003 + step * 1009 + dist.rank)
        common: dict[str, Any] = dict(
            group_size=G,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_prompt_tokens=cfg.max_prompt_tokens,
            system_prompt=cfg.system_prompt,
            generator=gen,
            precision=precision,
            device=device,
        )
        rollout = rollout_batch(
            policy, tokenizer, batch, env=cfg.env, max_turns=cfg.max_turns, **common
        )
        gen_s = time.perf_counter() - t0
        groups = [
            ScoreGroup(
                id=p.id,
                prompt=p.question,
                reference=p.reference,
                responses=rollout.texts[g * G : (g + 1) * G],
            )
            for g, p in enumerate(batch)
        ]
        future = rewards.submit(cfg.recipe, groups)
        t1 = time.perf_counter()
        if need_old:
            rollout.old_logps = sequence_logprobs(policy, rollout, cfg.micro_batch_size, precision)
        if ref is not None:
            rollout.ref_logps = sequence_logprobs(ref, rollout, cfg.micro_batch_size, precision)
        return Pending(rollout, future, gen_s, time.perf_counter() - t1)

    def save(step: int) -> None:
        """Checkpoint (policy, optimizer, scheduler) tagged with the recipe it trained on."""
        meta = {"recipe_fingerprint": fingerprint}  # read at call time: the latest recipe
        checkpoint.save(run_dir, step, policy, tokenizer, opt, sched, meta, cfg.keep_checkpoints)

    # rewards thread and progress bar are closed however the run ends
    with contextlib.closing(rewards), contextlib.closing(logger):
        if cfg.eval_every and start_step == 0:
            run_eval(0)
        t_first = time.perf_counter()
        pending = produce(start_step) if cfg.pipeline else None
        skipped_in_row, summary, seen_error_kinds = 0, {}, set()
        for step in range(start_step, cfg.steps):
            t_step = t_first if step == start_step else time.perf_counter()
            # 1-2. Rollout + reward requests (pipelined: sample batch k+1 while k is scored)
            if pending is not None:
                current = pending
                pending = produce(step + 1) if step + 1 < cfg.steps else None
                # time spent this iteration: the next batch's sampling (+ the first batch's, once)
                gen_s = (current.gen_s if step == start_step else 0.0) + (
                    pending.gen_s if pending else 0.0
                )
                logp_s = (current.logp_s if step == start_step else 0.0) + (
                    pending.logp_s if pending else 0.0
                )
            else:
                current = produce(step)
                gen_s, logp_s = current.gen_s, current.logp_s
            roll = current.rollout

            # 3. Wait for the rewards; a gateway outage skips the batch on every rank
            t_wait = time.perf_counter()
            result: BatchRewards | None = None
            try:
                result = current.rewards.result()
            except RewardsUnavailable as e:
                log.warning("step %d: batch skipped, no rewards: %s", step, e)
            wait_s = time.perf_counter() - t_wait
            if dist.any(result is None, device):
                skipped_in_row += 1
                logger.write({"kind": "skip", "step": step + 1, "reason": "rewards unavailable"})
                if skipped_in_row > cfg.max_skipped_batches:
                    raise RuntimeError(
                        f"{skipped_in_row} batches in a row without rewards: "
                        f"is the gateway at {cfg.gateway_url} up?"
                    )
                continue
            assert result is not None
            skipped_in_row = 0
            for kind, n in result.error_kinds().items():
                if kind not in seen_error_kinds:  # say it once per kind; counts go to the metrics
                    seen_error_kinds.add(kind)
                    log.warning(
                        "step %d: %d null reward(s) of kind %r (masked, advantage 0)", step, n, kind
                    )
            if result.fingerprint != fingerprint:
                if fingerprint:
                    log.warning(
                        "recipe fingerprint changed: %s -> %s", fingerprint, result.fingerprint
                    )
                fingerprint = result.fingerprint
                logger.write(
                    {
                        "kind": "recipe",
                        "step": step + 1,
                        "recipe": result.recipe_name,
                        "fingerprint": fingerprint,
                    }
                )

            # 4. Advantages: group-normalised over non-null rewards; null rewards -> A = 0
            r = torch.tensor(result.flat(), dtype=torch.float32)
            adv = group_advantages(r, G, scale=cfg.scale_rewards, eps=cfg.adv_eps).to(device)

            # 5. Loss and optimizer step: mu passes over the batch, micro-batches accumulated
            t_train = time.perf_counter()
            stats = train_on_batch(cfg, model, policy, opt, roll, adv, dist, device, precision)
            sched.step()
            train_s = time.perf_counter() - t_train

            # 6. Log
            step_s = time.perf_counter() - t_step
            record = step_metrics(result, r, G, roll, stats)
            record.update(
                {
                    "step": step + 1,
                    "lr": sched.get_last_lr()[0],
                    "time/generate": gen_s,
                    "time/logprobs": logp_s,
                    "time/reward_wait": wait_s,
                    "time/train": train_s,
                    "time/step": step_s,
                    "time/reward_latency": result.elapsed_s,
                    "reward_wait_frac": wait_s / step_s,
                    "tokens_per_s": roll.action_tokens / step_s,
                }
            )
            record = reduce_record(record, dist, device)
            logger.step(record)
            summary = record
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                run_eval(step + 1)
            if (
                cfg.save_every
                and (step + 1) % cfg.save_every == 0
                and step + 1 < cfg.steps
                and dist.main
            ):
                save(step + 1)

        # --- end: final eval, checkpoint, curves
        if cfg.eval_every:
            run_eval(cfg.steps)
        if dist.main:
            save(cfg.steps)
            if cfg.plot:
                plot_curves(run_dir)
    dist.barrier()
    return summary
