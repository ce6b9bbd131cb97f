"""One way to build a run: one model resolver, one settings swap, the engine owning its sandbox,
registries selected by config keys, per-rank seeds, tied temperatures, start-up checks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from stare_tir.config import ConfigError, load_config
from stare_tir.rollout.backends.base import BackendBase
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine
from stare_tir.rollout.trajectory import Trajectory
from stare_tir.train_config import TrainConfig


class NullBackend(BackendBase):
    """A backend of the rank's own that takes every push and generates nothing."""

    def update_weights(self, named_tensors, version=None) -> None:
        for _ in named_tensors:
            pass


def traj(group: int, reward: float) -> Trajectory:
    t = Trajectory(prompt_ids=[1, 2], group_id=group, reward=reward, finish_reason="answer")
    t.append([5, 5, 5], [-0.5] * 3, "model")
    return t


# ----------------------------------------------------------------------------- one model resolver


def test_tiny_is_the_same_model_in_training_and_evaluation():
    from stare_tir.eval.command import EvalRunConfig
    from stare_tir.model import ModelConfig, pretrained_tiny_base, resolve_model_path

    train, ev = TrainConfig().model, EvalRunConfig().model
    assert type(train) is type(ev) is ModelConfig
    assert resolve_model_path(ev) == resolve_model_path(train) == str(pretrained_tiny_base())
    assert load_config(EvalRunConfig, None, ["model.path=tiny"]).model.path == "tiny"


# ----------------------------------------------------------------------------- the engine


class RecordingSandbox:
    """Records on which event loop it is started and how often it is stopped."""

    def __init__(self) -> None:
        self.entered_on = None
        self.exits = 0

    async def __aenter__(self):
        self.entered_on = asyncio.get_running_loop()
        return self

    async def __aexit__(self, *exc) -> None:
        self.exits += 1


def test_engine_starts_its_sandbox_on_its_loop_and_stops_it_once():
    box = RecordingSandbox()
    engine = RolloutEngine(backend=None, tokenizer=None, env_factory=lambda p: None, sandbox=box)
    assert engine.sandbox is box and box.entered_on is engine._loop and box.exits == 0
    engine.close()
    engine.close()
    assert box.exits == 1 and engine.sandbox is None


def test_engine_configured_swaps_settings_and_restores_them_even_on_error():
    engine = RolloutEngine(
        backend=None, tokenizer=None, env_factory=lambda p: None, cfg=RolloutConfig(temperature=1.0, seed=None)
    )
    own = engine.cfg
    with engine.configured(seed=5) as cfg:
        assert engine.cfg.seed == 5 and cfg is engine.cfg and own.seed is None
    assert engine.cfg is own
    with pytest.raises(RuntimeError), engine.configured(RolloutConfig(top_p=0.5), seed=1):
        assert (engine.cfg.top_p, engine.cfg.seed) == (0.5, 1)
        raise RuntimeError("boom")
    assert engine.cfg is own


def test_build_components_runs_real_rollouts_and_closes_the_sandbox():
    from envs.arithmetic import make_problems
    from envs.retool import RetoolConfig
    from sandbox import SandboxConfig
    from stare_tir.components import build_components
    from stare_tir.model import ModelConfig

    rollout = RolloutConfig(n_per_prompt=2, max_total_tokens=48, max_new_tokens_per_turn=24, seed=0, progress=False)
    parts = build_components(
        ModelConfig(path="tiny"), "hf", rollout, RetoolConfig(prompt="short"), SandboxConfig(workers=1)
    )
    try:
        box = parts.engine.sandbox
        assert box is not None
        trajs, stats = parts.engine.run(make_problems(2, seed=0, split="test"))
        assert len(trajs) == 4 and stats["engine/trajectories"] == 4
        assert all(0 < len(t.response_ids) <= 48 for t in trajs)
    finally:
        parts.close()
    assert parts.engine.sandbox is None


# ----------------------------------------------------------------------------- trainer wiring


class RankLearner:
    world_size = 2

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def all_reduce_sum(self, x):
        return x.clone()

    def shard(self, items):
        return list(items)


class SeedRecordingEngine:
    configured = RolloutEngine.configured  # the real settings swap

    def __init__(self, cfg):
        self.cfg, self.seeds = cfg, []

    def run(self, problems, n):
        self.seeds.append(self.cfg.seed)
        return [traj(g, float(s % 2)) for g in range(len(problems)) for s in range(n)], {}


def _collect(rank: int, step: int = 3) -> list:
    from stare_tir.data import PromptSampler
    from stare_tir.trainer import collect_batch

    cfg = load_config(TrainConfig, None, ["trainer.prompts_per_step=2", "rollout.n_per_prompt=2"])
    engine = SeedRecordingEngine(cfg.rollout)
    run = SimpleNamespace(
        cfg=cfg,
        learner=RankLearner(rank),
        engine=engine,
        sampler=PromptSampler([{"id": str(i)} for i in range(10)], seed=0),
    )
    collect_batch(run, step=step)
    return engine.seeds


def test_ranks_sample_with_their_own_seeds_and_a_rerun_with_the_same():
    assert _collect(0) == _collect(0)  # deterministic: a resumed run samples what it would have
    assert set(_collect(0)).isdisjoint(_collect(1))  # ranks never share sampling streams
    assert set(_collect(0, step=3)).isdisjoint(_collect(0, step=4))


def test_algo_keys_select_the_registered_advantage_and_policy_loss(tmp_path):
    from stare_tir.algos.policy_loss import POLICY_LOSSES
    from stare_tir.data import PromptSampler
    from stare_tir.trainer import Run, group_advantages, rl_step

    batch = [traj(0, 1.0), traj(0, -1.0), traj(0, -1.0)]
    grpo, _ = group_advantages(batch, "grpo")
    drgrpo, _ = group_advantages(batch, "drgrpo")
    assert drgrpo == pytest.approx([4 / 3, -2 / 3, -2 / 3]) and grpo != pytest.approx(drgrpo)

    class Learner(RankLearner):
        world_size = 1
        steps_applied = 1

        def __init__(self):
            super().__init__(0)
            self.kw = None

        def compute_logprobs_entropy(self, trajs):
            lps = [torch.full((len(t.response_ids),), -0.5) for t in trajs]
            return lps, [torch.full_like(lp, float("nan")) for lp in lps]  # a diverged recompute pass

        def all_gather_flat(self, x):
            return x.reshape(-1).clone(), slice(0, x.numel())

        def train_step(self, trajs, advantages, omega, old_lp, **kw):
            self.kw = kw
            return {"loss": 0.1, "step_skipped": 0.0}

        def export_weights(self):
            return iter(())

    cfg = load_config(
        TrainConfig,
        None,
        ["trainer.prompts_per_step=1", "rollout.n_per_prompt=2", "algo.advantage=drgrpo", "algo.policy_loss=clip"],
    )
    engine = SeedRecordingEngine(cfg.rollout)
    learner = Learner()
    run = Run(
        cfg=cfg,
        run_dir=tmp_path,
        parts=SimpleNamespace(engine=engine, backend=NullBackend(), tokenizer=None),
        learner=learner,
        sampler=PromptSampler([{"id": "a"}], seed=0),
        eval_problems=[],
        log=None,
    )
    metrics = rl_step(run, 1)
    assert learner.kw["loss_fn"] is POLICY_LOSSES.get("clip")
    # A NaN batch entropy: the controller keeps its state and counts the step; the run goes on.
    assert metrics["stare/nonfinite_entropy_steps"] == 1.0 and metrics["stare/gate_on"] == 0.0


def test_unknown_registry_names_list_the_valid_ones():
    # refused when the config loads, naming the key and every registered name
    with pytest.raises(ConfigError, match=r"algo.advantage='gae'.*grpo, drgrpo"):
        load_config(TrainConfig, None, ["algo.advantage=gae"])
    with pytest.raises(ConfigError, match=r"algo.policy_loss='ppo'.*clip"):
        load_config(TrainConfig, None, ["algo.policy_loss=ppo"])


# ----------------------------------------------------------------------------- silent drift


def test_learner_and_rollout_temperatures_must_agree():
    with pytest.raises(
        ConfigError, match=r"rollout.temperature=0.7 but learner.temperature=1.0.*learner.temperature=0.7"
    ):
        load_config(TrainConfig, None, ["rollout.temperature=0.7"])
    cfg = load_config(TrainConfig, None, ["rollout.temperature=0.7", "learner.temperature=0.7"])
    assert cfg.rollout.temperature == cfg.learner.temperature == 0.7


def test_truncated_sampling_with_tis_is_refused():
    with pytest.raises(ConfigError, match=r"algo.tis_cap=2.0 with rollout.top_p=0.9"):
        load_config(TrainConfig, None, ["algo.tis_cap=2.0", "rollout.top_p=0.9"])
    with pytest.raises(ConfigError, match="top_k"):
        load_config(TrainConfig, None, ["algo.tis_cap=2.0", "rollout.top_k=50"])
    assert load_config(TrainConfig, None, ["algo.tis_cap=2.0"]).algo.tis_cap == 2.0
    assert load_config(TrainConfig, None, ["rollout.top_p=0.9"]).rollout.top_p == 0.9  # no TIS: fine


# ----------------------------------------------------------------------------- start-up checks


def test_preflight_names_the_problem_and_the_fix(tmp_path):
    from sandbox import SandboxConfig
    from stare_tir.app.preflight import StartupError, check_data, check_model, check_sandbox
    from stare_tir.data import DataConfig
    from stare_tir.model import ModelConfig

    with pytest.raises(StartupError, match=r"model.path='\./no/such/model': no such directory"):
        check_model(ModelConfig(path="./no/such/model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(StartupError, match="holds no config.json"):
        check_model(ModelConfig(path=str(tmp_path / "empty")))
    # A hub id is asked of the hub (tests/core/test_core_preflight_remote.py covers the answers).

    with pytest.raises(StartupError, match=r"data.train=.*missing.jsonl"):
        check_data(DataConfig(train=str(tmp_path / "missing.jsonl")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "no answer"}\n')
    with pytest.raises(StartupError, match=r"data.train: .*row 2.*on_bad_row=skip"):
        check_data(DataConfig(train=str(bad)))
    assert check_data(DataConfig(train=str(bad), on_bad_row="skip"))["train"] == 1

    no_engine = SandboxConfig(backend="docker")
    no_engine.docker.base_url = f"unix://{tmp_path}/no-docker.sock"
    with pytest.raises(StartupError, match=r"sandbox.backend=docker cannot start: .*start the Docker engine"):
        check_sandbox(no_engine)


# ----------------------------------------------------------------------------- pass-through settings


def test_deepspeed_overrides_merge_deeply_and_owned_keys_are_refused():
    from stare_tir.learner.deepspeed_config import merge_deepspeed_config

    generated = {"zero_optimization": {"stage": 3, "contiguous_gradients": True}, "gradient_clipping": 1.0}
    merged = merge_deepspeed_config(generated, {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})
    assert merged["zero_optimization"] == {
        "stage": 3,
        "contiguous_gradients": True,
        "offload_optimizer": {"device": "cpu"},
    }
    assert generated["zero_optimization"] == {"stage": 3, "contiguous_gradients": True}  # not mutated
    for key, fix in (
        ("gradient_clipping", "learner.grad_clip"),
        ("bf16", "learner.dtype"),
        ("gradient_accumulation_steps", "accumulation boundaries"),
    ):
        with pytest.raises(ConfigError, match=rf"learner.deepspeed.{key}: owned by the learner.*{fix}"):
            load_config(TrainConfig, None, [f"learner.deepspeed={{{key}: 1}}"])
    with pytest.raises(ConfigError, match="learner.zero_stage"):
        load_config(TrainConfig, None, ["learner.deepspeed.zero_optimization.stage=1"])
    cfg = load_config(TrainConfig, None, ["learner.deepspeed.zero_optimization.reduce_bucket_size=1000"])
    assert cfg.learner.deepspeed == {"zero_optimization": {"reduce_bucket_size": 1000}}


def test_wandb_run_id_is_stored_and_reused_on_resume(tmp_path, monkeypatch):
    import sys

    from stare_tir.tracking import MetricsLog, wandb_run_id

    first = wandb_run_id(tmp_path, resume=False)
    assert (tmp_path / "wandb_run_id").read_text().strip() == first
    assert wandb_run_id(tmp_path, resume=True) == first
    assert wandb_run_id(tmp_path, resume=False) != first  # a fresh run is a new W&B run

    # What reaches wandb.init (wandb/sdk/wandb_init.py: init(project=, name=, config=, id=, resume=));
    # W&B itself needs its service and network, so a module stand-in records the call.
    calls = []
    fake = SimpleNamespace(
        init=lambda **kw: calls.append(kw) or SimpleNamespace(log=lambda *a, **k: None, finish=lambda: None)
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    MetricsLog(tmp_path, wandb_project="p", run_name="r", wandb_id="abc123").close()
    assert calls[0]["id"] == "abc123" and calls[0]["resume"] == "allow"


@pytest.mark.parametrize("rank,name", [(0, "train.log"), (1, "train.rank1.log")])
def test_each_rank_logs_to_its_own_file_with_a_rank_tag(tmp_path, rank, name):
    from loguru import logger

    from stare_tir.tracking import setup_run_logging

    before = set(logger._core.handlers)
    path = setup_run_logging(tmp_path, rank=rank)
    try:
        logger.info("hello from the test")
    finally:
        for handler_id in set(logger._core.handlers) - before:
            logger.remove(handler_id)
    assert path == tmp_path / name
    line = path.read_text().strip().splitlines()[-1]
    assert f"| rank{rank} |" in line and "hello from the test" in line
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_configs_load_without_torch():
    import subprocess
    import sys

    code = (
        "import sys; import stare_tir.app.cli; from stare_tir.app.command_line import config_keys; "
        "from stare_tir.train_config import TrainConfig; "
        "from stare_tir.eval.command import EvalRunConfig; assert config_keys(TrainConfig); "
        "print(sorted({'torch', 'transformers', 'deepspeed'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "[]", out.stderr


def _remote_code_model(tmp_path: Path) -> Path:
    """The tiny base as a repository that ships its own modeling code (config.json auto_map)."""
    import json
    import shutil

    from stare_tir.model import pretrained_tiny_base

    repo = tmp_path / "custom-model"
    shutil.copytree(pretrained_tiny_base(), repo)
    (repo / "modeling_custom.py").write_text(
        "from transformers import Qwen2ForCausalLM\n\n\nclass CustomQwen2ForCausalLM(Qwen2ForCausalLM):\n    pass\n"
    )
    config = json.loads((repo / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomQwen2ForCausalLM"}
    (repo / "config.json").write_text(json.dumps(config))
    return repo


def test_trust_remote_code_reaches_the_rollout_model(tmp_path):
    from stare_tir.components import make_backend
    from stare_tir.model import ModelConfig, load_tokenizer

    repo = str(_remote_code_model(tmp_path))
    rollout = RolloutConfig(progress=False)
    for trust, cls in ((False, "Qwen2ForCausalLM"), (True, "CustomQwen2ForCausalLM")):
        model = ModelConfig(path=repo, trust_remote_code=trust)
        backend = make_backend("hf", repo, load_tokenizer(model, repo), rollout, trust_remote_code=trust)
        try:
            assert type(backend.model).__name__ == cls
        finally:
            backend.close()


def test_chat_template_override_is_what_the_engine_applies(tmp_path):
    from stare_tir.model import ModelConfig, load_tokenizer, pretrained_tiny_base

    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    tok = load_tokenizer(ModelConfig(chat_template=str(template)), str(pretrained_tiny_base()))
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "[user] hi\n[assistant] "
