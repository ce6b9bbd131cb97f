"""The learner: a DeepSpeed engine around a Hugging Face causal LM, and its pieces.

`config` (LearnerConfig, `learner.*`), `learner` (the Learner: recompute, update, export, save),
`micro_batch` (token-budget batching), `step_guard` (non-finite step skipping), `deepspeed_config`
(the generated config and its pass-through), `distributed` (process groups, RNG state), `parts`
(the log-prob model wrapper, the LR schedule), `policy_step` (one micro-batch's policy loss, the
forward's values per trajectory). Every module imports torch and DeepSpeed only
where used, so `LearnerConfig` stays importable by light paths.
"""

from stare_tir.learner.config import LearnerConfig
from stare_tir.learner.learner import Learner

__all__ = ["Learner", "LearnerConfig"]
