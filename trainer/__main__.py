"""``python -m arbiter.trainer --config CONFIG.yaml [key=value ...]`` (also under ``torchrun``)."""

from __future__ import annotations

import argparse
import sys

import yaml

from arbiter.errors import InvalidRequest
from arbiter.trainer.config import ConfigError, RunError, TrainerConfig, help_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m arbiter.trainer",
        description="GRPO trainer scoring rollout groups through the Arbiter gateway.",
        epilog="Overrides: key=value (YAML values), e.g. steps=50 beta=0.04 pipeline=true.",
    )
    parser.add_argument("--config", help="YAML file of settings (see --help-config)")
    parser.add_argument("--help-config", action="store_true", help="list every setting and exit")
    parser.add_argument("overrides", nargs="*", help="key=value settings applied after --config")
    args = parser.parse_args(argv)
    if args.help_config:
        sys.stdout.write(help_text() + "\n")
        return 0
    try:
        cfg = TrainerConfig.load(args.config, args.overrides)
    except (ConfigError, FileNotFoundError, yaml.YAMLError) as e:  # one line, no traceback
        parser.exit(2, f"config error: {' '.join(str(e).split())}\n")
    import torch.distributed as dist

    from arbiter.trainer.loop import train

    try:
        train(cfg)
    except InvalidRequest as e:  # the gateway refused the recipe or the key: one clear line
        sys.stderr.write(f"arbiter.trainer: {e.message}\n")
        return 2
    except RunError as e:  # run_dir in use, no model there, gateway unreachable: one line
        sys.stderr.write(f"arbiter.trainer: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(
            f"\narbiter.trainer: interrupted; resume=true run_dir={cfg.run_dir} continues "
            "from the last checkpoint\n"
        )
        return 130
    finally:
        if dist.is_initialized():  # torchrun: release the process group (NCCL warns otherwise)
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
