"""learner.deepspeed reaches the real DeepSpeed engine (CPU, gloo, 1 process)."""

from __future__ import annotations


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
