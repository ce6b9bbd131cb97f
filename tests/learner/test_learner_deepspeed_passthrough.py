"""learner.deepspeed reaches the real DeepSpeed engine (CPU, gloo, 1 process)."""

from __future__ import annotations

import pytest


def test_passthrough_settings_reach_the_deepspeed_engine(tiny_path):
    from stare_tir.learner import Learner, LearnerConfig

    cfg = LearnerConfig(
        zero_stage=2, lr=1e-3, micro_batch_tokens=64, deepspeed={"zero_optimization": {"reduce_bucket_size": 123_456}}
    )
    learner = Learner(tiny_path, cfg)
    assert learner.engine.zero_optimization_stage() == 2  # the generated part is kept
    assert learner.engine.zero_reduce_bucket_size() == 123_456  # the pass-through is merged over it
    default = Learner(tiny_path, LearnerConfig(zero_stage=2, lr=1e-3, micro_batch_tokens=64))
    assert default.engine.zero_reduce_bucket_size() != 123_456


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        # the pass-through would silently override learner.zero3_persistence_threshold
        ({"zero_optimization": {"stage3_param_persistence_threshold": 0}}, "learner.zero3_persistence_threshold"),
        ({"zero_force_ds_cpu_optimizer": True}, "owned by the learner"),
        ({"torch_autocast": {"enabled": True}}, "learner.dtype"),
        ({"checkpoint": {"load_universal": True}}, "owned by the learner"),
        # modes that step an optimizer of their own: a skipped step would be applied anyway
        ({"zero_optimization": {"zenflow": {"topk_ratio": 0.1}}}, "ZenFlow"),
        ({"zero_optimization": {"offload_optimizer": {"device": "cpu", "super_offload": True}}}, "SuperOffload"),
        ({"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 0.5}}}, "backup_optimizer"),
        ({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}}, "NVMe"),
        ({"zero_optimization": {"offload_param": {"device": "nvme"}}}, "NVMe"),
        ({"zero_optimization": {"offload_optimizer": "cpu"}}, "expected a mapping"),
    ],
)
def test_owned_keys_and_modes_with_their_own_optimizer_are_refused(overrides, needle):
    from stare_tir.learner import LearnerConfig

    with pytest.raises(ValueError, match=needle):
        LearnerConfig(zero_stage=3, deepspeed=overrides)


def test_offload_is_refused_where_the_stage_has_nothing_to_offload():
    from stare_tir.learner import LearnerConfig

    with pytest.raises(ValueError, match="offload_optimizer needs learner.zero_stage >= 1"):
        LearnerConfig(zero_stage=0, deepspeed={"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})
    with pytest.raises(ValueError, match="offload_param needs learner.zero_stage=3"):
        LearnerConfig(zero_stage=2, deepspeed={"zero_optimization": {"offload_param": {"device": "cpu"}}})
    LearnerConfig(zero_stage=1, deepspeed={"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})
    LearnerConfig(zero_stage=3, deepspeed={"zero_optimization": {"offload_optimizer": {"super_offload": False}}})


def test_a_changed_zero_stage_on_resume_is_refused_with_the_saved_one(tmp_path):
    from stare_tir.learner.checkpoint_layout import load_layout, needs_universal, save_layout

    save_layout(tmp_path, world_size=8, zero_stage=2, deepspeed_version="0.19.8")
    layout = load_layout(tmp_path)
    with pytest.raises(ValueError, match="resume with learner.zero_stage=2"):
        needs_universal(layout, world_size=8, zero_stage=3)
    assert needs_universal(layout, world_size=4, zero_stage=2) and not needs_universal(layout, 8, 2)
    # no layout file (an older checkpoint): read from DeepSpeed's per-rank file names
    ds = tmp_path / "old" / "deepspeed"
    ds.mkdir(parents=True)
    for r in range(4):
        (ds / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").touch()
    assert load_layout(tmp_path / "old") == {"world_size": 4, "zero_stage": None}
    assert needs_universal(load_layout(tmp_path / "old"), world_size=2, zero_stage=1)


def test_a_failed_universal_conversion_stops_with_the_command_to_run(tmp_path):
    from stare_tir.learner.checkpoint_layout import universal_checkpoint

    (tmp_path / "deepspeed").mkdir()
    (tmp_path / "deepspeed" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_text("not a checkpoint")
    with pytest.raises(RuntimeError, match=r"saved by 2 ranks, this run has 1.*ds_to_universal --input_folder"):
        universal_checkpoint(tmp_path, rank=0, saved_world=2, world_size=1, all_reduce_sum=lambda t: t)
    assert not (tmp_path / "universal").exists()  # no half-written copy left to be loaded later
