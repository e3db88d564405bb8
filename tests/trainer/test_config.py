"""Config: YAML + overrides, and errors that say how to fix the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbiter.trainer.__main__ import main
from arbiter.trainer.config import ConfigError, TrainerConfig, help_text

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        # batch not made of whole groups: the message proposes the nearest valid sizes
        (["rollouts_per_step=10", "group_size=4"], "set rollouts_per_step=8 or 12"),
        # GRPO needs a group to compare against
        (["group_size=1"], "needs >= 2 completions per prompt"),
        # micro-batches must tile the batch
        (["rollouts_per_step=16", "group_size=4", "micro_batch_size=5"], "choose a divisor"),
        # rollouts must sample
        (["temperature=0"], "use > 0"),
        # a typo in a setting name is not silently ignored
        (["learning_rate=1e-5"], "unknown setting(s) ['learning_rate']"),
        # wrong type
        (["lr=fast"], "lr='fast': expected a float"),
        # an inline recipe needs components
        (["recipe={}"], "give a recipe name"),
        # an inline recipe is checked against the wire model before any GPU time is spent
        (
            ['recipe={"components": [{"name": "format", "wieght": 1}]}'],
            "recipe.components.0.wieght",
        ),
        (["loss_agg=sum"], "use token_mean or seq_mean"),
        (["beta=-1"], "must be >= 0"),
        # a chunk of log-probs holds at least one token (0 = no chunking)
        (["logprob_chunk_tokens=-1"], "use >= 1 (e.g. 1024), or 0"),
        # layers kept out of a checkpointing that is off: a mistake, not a no-op
        (["gradient_checkpointing_keep_layers=2"], "only with gradient_checkpointing=true"),
        (["gradient_checkpointing=true", "gradient_checkpointing_keep_layers=-1"], "use >= 0"),
        # booleans are booleans
        (["fsdp=maybe"], "fsdp='maybe': expected true or false"),
        # override syntax
        (["steps"], "write key=value"),
    ],
)
def test_config_errors_say_how_to_fix(overrides: list[str], fix: str) -> None:
    with pytest.raises(ConfigError) as e:
        TrainerConfig.load(None, ["model=/m", *overrides])
    assert fix in str(e.value)


def test_missing_model() -> None:
    with pytest.raises(ConfigError, match="set model=PATH"):
        TrainerConfig.load(None, [])


def test_yaml_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: /m\nlr: 1e-6\nsteps: 5\nrecipe: {components: [{name: format}]}\n")
    cfg = TrainerConfig.load(path, ["steps=7", "pipeline=true", "beta=0.04"])
    # YAML 1.1 reads 1e-6 as a string: coerced to float
    assert (cfg.lr, cfg.steps, cfg.pipeline, cfg.beta) == (1e-6, 7, True, 0.04)
    assert cfg.recipe == {"components": [{"name": "format"}]}
    # the saved config loads back to the same settings
    cfg.dump(tmp_path / "saved.yaml")
    assert TrainerConfig.load(tmp_path / "saved.yaml") == cfg


@pytest.mark.parametrize(
    "name",
    ["tiny-cpu.yaml", "cpu-demo.yaml", "qwen2.5-1.5b-gsm8k.yaml", "qwen2.5-7b-gsm8k-fsdp.yaml"],
)
def test_example_configs_load(name: str) -> None:
    cfg = TrainerConfig.load(REPO / "configs" / name)
    assert cfg.rollouts_per_step % cfg.group_size == 0


def test_every_setting_has_help() -> None:
    for name, f in TrainerConfig.field_names().items():
        assert f.metadata.get("help"), name
    assert "rollouts_per_step" in help_text()


def test_cli_reports_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["model=/m", "group_size=3", "rollouts_per_step=8"])
    assert e.value.code == 2
    assert "rollouts_per_step=6 or 9" in capsys.readouterr().err


def test_gateway_url_follows_arbiter_url_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBITER_URL", "http://127.0.0.1:28000")
    assert TrainerConfig(model="m").gateway_url == "http://127.0.0.1:28000"
    # the shipped configs leave it out: they follow ARBITER_URL too
    cfg = TrainerConfig.load(REPO / "configs" / "tiny-cpu.yaml")
    assert cfg.gateway_url == "http://127.0.0.1:28000"
    assert TrainerConfig(model="m", gateway_url="http://h:1").gateway_url == "http://h:1"
    monkeypatch.delenv("ARBITER_URL")
    assert TrainerConfig(model="m").gateway_url == "http://127.0.0.1:8000"
