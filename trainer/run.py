"""A training run's parts, built once: models, optimizer, data, rewards client, sampler, resume.

``build_run(cfg)`` returns a ``Run``; the loop in ``trainer.loop`` only reads it (and
advances ``fingerprint`` and the skip counter). Resuming loads the newest complete
checkpoint: weights, optimizer, scheduler, step, recipe fingerprint and this rank's RNG
states, so the run continues as if it had never stopped.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from arbiter.trainer import checkpoint, parallel
from arbiter.trainer.config import TrainerConfig
from arbiter.trainer.data import Problem, load_problems
from arbiter.trainer.generation import Sampler
from arbiter.trainer.grpo import allocate_state, build_optimizer
from arbiter.trainer.metrics import RunLogger
from arbiter.trainer.ors import PREFIX as ORS_PREFIX
from arbiter.trainer.ors import OrsEnvironments
from arbiter.trainer.rewards import RewardClient, check_recipes
from arbiter.trainer.rollout import RolloutSpec
from arbiter.trainer.sampling import SamplingParams
from arbiter.trainer.setup import (
    Dist,
    check_model_path,
    init_distributed,
    load_model,
    load_tokenizer,
    prepare_run_dir,
    resolve_precision,
    setup_logging,
)
from arbiter.trainer.update import multi_turn_eager

log = logging.getLogger("trainer")


@dataclass
class Run:
    """Everything one training run holds."""

    cfg: TrainerConfig
    dist: Dist
    device: torch.device
    precision: str  # resolved: fp32, bf16-mixed or bf16
    run_dir: Path
    tokenizer: Any
    policy: Any  # the trained model
    model: Any  # what the training forward calls: the policy (FSDP2-sharded or not) or DDP
    ref: Any | None  # the frozen reference (beta > 0)
    sampler: Sampler
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    problems: list[Problem]
    eval_problems: list[Problem]
    rewards: RewardClient
    logger: RunLogger
    spec: RolloutSpec
    sampling: SamplingParams  # the rollouts' settings; each step sets its own generator
    start_step: int = 0
    fingerprint: str = ""  # of the recipe the latest rewards came from
    skipped_in_row: int = 0
    seen_error_kinds: set[str] = field(default_factory=set)
    ors: OrsEnvironments | None = None  # env=ors:<name>: episodes through the service

    def sampling_for(self, step: int) -> SamplingParams:
        """The step's sampling settings; its generator is a function of (seed, step, rank)."""
        seed = self.cfg.seed * 1_000_003 + step * 1009 + self.dist.rank
        gen = torch.Generator(self.device).manual_seed(seed)
        return dataclasses.replace(self.sampling, generator=gen)

    def eval_sampling(self) -> tuple[RolloutSpec, SamplingParams]:
        """Greedy, one completion per problem."""
        max_new = self.cfg.eval_max_new_tokens or self.cfg.max_new_tokens
        spec = dataclasses.replace(self.spec, group_size=1)
        params = dataclasses.replace(
            self.sampling, max_new_tokens=max_new, temperature=0.0, top_p=1.0
        )
        return spec, params

    def save(self, step: int) -> None:
        """Checkpoint (policy, optimizer, scheduler, RNG) tagged with the recipe it trained on."""
        meta = {"recipe_fingerprint": self.fingerprint}
        checkpoint.save(
            self.run_dir,
            step,
            self.policy,
            self.tokenizer,
            self.opt,
            self.sched,
            meta,
            self.cfg.keep_checkpoints,
            self.dist,
        )

    def close(self) -> None:
        self.rewards.close()
        if self.ors is not None:
            self.ors.close()
        self.logger.close()


def build_run(cfg: TrainerConfig) -> Run:
    dist, device = init_distributed(cfg.device, cfg.cpu_threads)
    setup_logging(dist.main)
    check_model_path(cfg.model)
    # before anything is loaded or written: a recipe the gateway cannot serve stops here
    check_recipes(cfg)
    precision = resolve_precision(cfg.precision, device)
    if dist.main and (why := multi_turn_eager(cfg, device)):
        log.warning(why)
    run_dir = prepare_run_dir(cfg, dist)
    if dist.main:
        log.info(
            "config (saved to %s):\n%s",
            run_dir / "config.yaml",
            (run_dir / "config.yaml").read_text(),
        )
    torch.manual_seed(cfg.seed + dist.rank)

    # models: the policy (from the latest checkpoint when resuming), the frozen reference
    resume_from = checkpoint.latest(run_dir) if cfg.resume else None
    if cfg.resume and resume_from is None:
        log.warning("resume=true but %s holds no complete checkpoint: starting at step 0", run_dir)
    if resume_from is not None:
        checkpoint.check_layout(resume_from, sharded=cfg.fsdp)
    tokenizer = load_tokenizer(cfg.model)
    # FSDP2 shards from the CPU copy and moves each rank's shard to its GPU
    load_on = torch.device("cpu") if cfg.fsdp else device
    weights = resume_from if resume_from is not None and not cfg.fsdp else cfg.model
    policy = load_model(
        weights,
        load_on,
        precision,
        trainable=True,
        gradient_checkpointing=cfg.gradient_checkpointing,
        keep_layers=cfg.gradient_checkpointing_keep_layers,
    )
    model = parallel.wrap(
        policy, fsdp=cfg.fsdp, world=dist.world, device=device, precision=precision
    )
    ref = None
    if cfg.beta > 0:
        ref = load_model(cfg.model, load_on, precision, trainable=False)
        if cfg.fsdp:
            parallel.shard(ref, dist.world, device, precision)
    opt, sched = build_optimizer(
        policy,
        lr=cfg.lr,
        betas=(cfg.adam_betas[0], cfg.adam_betas[1]),
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_steps,
    )
    start_step, fingerprint = 0, ""
    if resume_from is not None:
        state = checkpoint.load(resume_from, policy, opt, dist.rank)
        sched.load_state_dict(state["scheduler"])
        checkpoint.restore_rng(state)
        start_step, fingerprint = int(state["step"]), state.get("recipe_fingerprint", "")
        log.info("resumed from %s: next step %d", resume_from, start_step + 1)
    sampler = Sampler(
        policy, compile=None if cfg.compile_sampler else False, keep_cache=cfg.sampler_keep_cache
    )
    if not (cfg.sampler_keep_cache or cfg.fsdp):  # (FSDP2 regathers weights: graphs anew)
        allocate_state(opt)  # before the first rollout: its freed cache comes back in place

    # data, rewards, logging, sampling
    problems = load_problems(f"{cfg.data_dir}/{cfg.train_file}", cfg.max_train_problems)
    eval_problems = (
        load_problems(f"{cfg.data_dir}/{cfg.eval_file}", cfg.eval_problems)
        if cfg.eval_every
        else []
    )
    rewards = RewardClient.from_config(cfg)
    logger = RunLogger(
        run_dir,
        total_steps=cfg.steps,
        start_step=start_step,
        enabled=dist.main,
        progress=cfg.progress,
        kl_term=cfg.beta > 0,
    )
    spec = RolloutSpec(
        group_size=cfg.group_size,
        max_prompt_tokens=cfg.max_prompt_tokens,
        system_prompt=cfg.system_prompt,
        env=cfg.env,
        max_turns=cfg.max_turns,
        precision=precision,
    )
    sampling = SamplingParams.for_tokenizer(
        tokenizer, cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p
    )
    return Run(
        cfg=cfg,
        dist=dist,
        device=device,
        precision=precision,
        run_dir=run_dir,
        tokenizer=tokenizer,
        policy=policy,
        model=model,
        ref=ref,
        sampler=sampler,
        opt=opt,
        sched=sched,
        problems=problems,
        eval_problems=eval_problems,
        rewards=rewards,
        logger=logger,
        spec=spec,
        sampling=sampling,
        ors=OrsEnvironments(cfg.env, cfg.gateway_url, cfg.api_key)
        if cfg.env.startswith(ORS_PREFIX)
        else None,
        start_step=start_step,
        fingerprint=fingerprint,
    )
