"""The typed config of a training run: model, algorithm and loop settings, and their composition.

`TrainConfig` is what `scripts/train_tir.py` loads (YAML + dotted overrides) and what every run
directory's config.yaml holds; its sections are the components' own config dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from envs.retool import RetoolConfig
from registry import Registry
from sandbox import SandboxConfig
from stare_tir.algos.advantage import ADVANTAGE_ESTIMATORS, OverlongPenaltyConfig
from stare_tir.algos.off_policy_config import OffPolicyConfig
from stare_tir.algos.policy_loss import POLICY_LOSSES
from stare_tir.algos.stare_config import StareConfig
from stare_tir.algos.token_methods import TOKEN_METHODS
from stare_tir.algos.verl_partition import VerlPartitionConfig
from stare_tir.data import DataConfig
from stare_tir.learner import LearnerConfig
from stare_tir.model import ModelConfig
from stare_tir.rollout.backends.base import ROLLOUT_BACKENDS
from stare_tir.rollout.engine import RolloutConfig
from stare_tir.sft.config import ColdStartConfig

# algo.name presets: the values each name gives the settings left unset (None). All but grpo and
# justrl build on GRPO-ds (clip-higher, token-mean, dynamic sampling), as the STARE paper's comparisons do. Every
# registered token method is a preset of its own name too: GRPO-ds plus that method (`algo_presets`); stare
# is one of them (stare_tir/algos/methods/stare.py).
BASE_PRESETS: dict[str, dict] = {
    "grpo": {"dynamic_sampling": False, "clip_high": "clip_low"},  # symmetric clip
    "grpo_ds": {},
    "stare": {},  # a token method's preset (below): listed here for its place in the list
    "dapo": {"overlong_penalty": True, "oversample": 3},
    # JustRL (arXiv 2512.16649, thunlp/JustRL train/run_training.sh): plain GRPO with clip-higher,
    # no dynamic sampling (all-equal groups stay, A = 0, in the token-mean's normaliser), no KL, no
    # overlong penalty or filter. Its dual clip 10, 4 mini-batches and optimizer schedule are set by
    # configs/retool_qwen2.5_7b_justrl.yaml (algo.dual_clip_c, algo.ppo_mini_batch_size, learner.*).
    "justrl": {"dynamic_sampling": False},
}
# What a setting left unset takes when the preset says nothing of it.
PRESET_DEFAULTS: dict[str, object] = {
    "policy_loss": "clip",
    "token_methods": [],
    "clip_high": 0.28,  # DAPO's clip-higher
    "dynamic_sampling": True,
    "oversample": 1,
    "overlong_penalty": False,
    "scope": "batch",
}


def algo_presets() -> dict[str, dict]:
    """Every algo.name and what it sets: the base presets, then one per registered token method (its
    settings class may add more in its `preset`, e.g. kl_cov's own loss)."""
    presets = dict(BASE_PRESETS)
    for entry in TOKEN_METHODS.entries():
        presets[entry.name] = {"token_methods": [entry.name], **getattr(entry.config, "preset", {})}
    return presets


@dataclass
class AlgoConfig:
    # A preset: grpo (symmetric clip, no dynamic sampling), grpo_ds (clip-higher, token-mean, dynamic
    # sampling, DAPO-style), stare (grpo_ds + STARE's token reweighting, settings in `stare`), dapo
    # (soft overlong penalty and 3x over-sampling), justrl (clip-higher GRPO without dynamic
    # sampling), or the name of any registered token method (grpo_ds plus that method: steer, eapo,
    # kl_cov, ...). It fills the settings below that are left unset (null); an
    # explicit value always wins. `--print-config` shows the values it resolved to.
    name: str = field(default="stare", metadata={"choices": lambda: tuple(algo_presets())})
    # Advantage estimator, by its registered name (stare_tir/algos/advantage.py): "grpo" normalises
    # rewards inside each group by the group std, "drgrpo" only centres them.
    advantage: str = field(default="grpo", metadata={"choices": ADVANTAGE_ESTIMATORS.names})
    # Policy loss, by its registered name (stare_tir/algos/policy_loss.py): "clip" is the clipped
    # surrogate with clip-higher, dual clip, TIS and token weights; "kl_cov" KL-Cov's unclipped one.
    # Unset: the preset's (kl_cov for algo.name=kl_cov, clip otherwise).
    policy_loss: str | None = field(default=None, metadata={"choices": POLICY_LOSSES.names})
    # Token-level methods applied in order, by their registered names (stare_tir/algos/methods/);
    # each method's settings are the section of its own name in algo (algo.kl_cov.ratio, ...). Unset:
    # the preset's. For algo.name=stare, stare is added last when not listed: its weights come on top.
    token_methods: list[str] | None = field(default=None, metadata={"choices": TOKEN_METHODS.names})
    # Lower clip; 1 removes it (Clip-Cov's script).
    clip_low: float = 0.2
    # Upper clip. Unset: clip_low for grpo (symmetric), 0.28 (clip-higher) for every other preset.
    clip_high: float | None = None
    # Dual-clip bound for negative advantages (None disables). verl's default 3; the official STARE
    # scripts use 10.
    dual_clip_c: float | None = 3.0
    # token-mean over the global batch (all micro-batches and ranks); the seq-mean modes; or "verl":
    # verl's token-mean inside each micro-batch of its partition (`verl_partition`), scaled by the
    # micro-batch's share of the rows, as the official runs aggregate (a verl behaviour that also
    # affects GRPO-ds).
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "verl"] = "token-mean"
    # Truncated importance sampling cap for rollout/trainer logprob mismatch (None: off).
    tis_cap: float | None = None
    # Behaviour-policy correction for stale rollouts (trainer.max_staleness >= 1): decoupled PPO's
    # capped weight pi_prox / pi_behav, truncated (tis) or masked (mis), per token or per sequence
    # (stare_tir/algos/off_policy.py). Off by default; algo.tis_cap is its token-level tis.
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    # With ppo_epochs == 1 and one mini-batch: the update's old log-probs are its own, detached
    # (ratio exactly 1, as verl does on-policy) instead of the recompute pass's (ratio 1 up to the
    # numerical difference of two forward passes). The recompute pass still gives entropy,
    # surprisal and TIS. With several mini-batches the first always takes its own and the later
    # ones the stored ones, whatever this says.
    ratio_one_on_policy: bool = False
    # The recompute pass (a no-grad forward for old log-probs and entropies before the update).
    # auto: skipped where the update's own forward gives the same inputs: one update per batch
    # (ppo_epochs 1, one mini-batch), no off-policy correction (algo.off_policy), no dropout,
    # and, where a token method or loss_agg=verl reads the batch's values before the loss, the batch
    # in one update micro-batch per rank; old = the update's own log-probs, detached (ratio exactly 1,
    # as ratio_one_on_policy). always: the pass runs every step (docs/learner.md).
    recompute: Literal["auto", "always"] = "auto"
    # Where selections happen (STARE's L+/L-, the token methods' top-k and quantiles): "batch" (every
    # loss token of the step, all ranks), "micro_batch" (inside each micro-batch of this learner's
    # update plan) or "verl" (inside each micro-batch of verl's partition, `verl_partition`: the
    # official runs' groups). Unset: the preset's (micro_batch for steer, batch otherwise).
    scope: Literal["batch", "micro_batch", "verl"] | None = None
    # The official runs' layout, for scope=verl and loss_agg=verl.
    verl_partition: VerlPartitionConfig = field(default_factory=VerlPartitionConfig)
    # Sampling rounds when too few groups have non-equal rewards (dynamic sampling only); each round
    # is a barrier on its slowest trajectory. The official STARE scripts allow 10.
    dynamic_sampling_rounds: int = 3
    # Dynamic sampling: drop groups whose rewards are all equal and refill the batch (up to
    # dynamic_sampling_rounds rounds). Unset: the preset's (off for grpo, on otherwise).
    dynamic_sampling: bool | None = None
    # Over-sampling k: a round rolls out k x the missing prompts and keeps the first informative
    # groups, so one barrier fills the batch in most steps (DAPO and the official STARE scripts:
    # 192 prompts for 64 groups, k = 3). Unset: the preset's (3 for dapo, 1 otherwise).
    oversample: int | None = None
    # When a sampling round ends. "all": after its last trajectory, keeping the first usable groups
    # in prompt order (the official STARE scripts and DAPO). "enough": groups are judged as they
    # complete (all n samples done) and the round ends once this rank holds its share of usable
    # groups; the trajectories still generating are cancelled (slime's over-sampling with abort), so
    # a round no longer waits for its slowest trajectory. Kept responses are then biased short:
    # compare rollout/kept_mean_length with rollout/all_mean_length. Synchronous runs only
    # (trainer.max_staleness=0).
    round_end: Literal["all", "enough"] = "all"
    # Trajectories with a void turn (a model turn with neither code nor answer, SimpleTIR): "keep";
    # "drop" them before the group statistics; or "mask" them: loss mask zeroed, the trajectory kept
    # in its group's advantage statistics (SimpleTIR's handling).
    void_turns: Literal["keep", "drop", "mask"] = "keep"
    # Drop trajectories cut by the token budget from the loss (DAPO overlong filtering).
    filter_overlong: bool = False
    # DAPO's soft overlong penalty on the reward (its `enabled`: the preset's, on for dapo).
    overlong_penalty: OverlongPenaltyConfig = field(default_factory=OverlongPenaltyConfig)
    # Policy-gradient passes over each batch (1 = on-policy; old logprobs still recomputed).
    ppo_epochs: int = 1
    # Prompts (GRPO groups) per mini-batch, as verl's actor.ppo_mini_batch_size: each step's batch
    # is cut into trainer.prompts_per_step / ppo_mini_batch_size disjoint mini-batches, in a fixed
    # order (each rank's trajectories in batch order, cut into consecutive runs), one optimizer step
    # each (per epoch). The first is on-policy (old = the update's own log-probs, detached), later
    # ones use the stored old log-probs; selections are made again per mini-batch from the current
    # policy (stare_tir/trainer/mini_batches.py). Unset: the whole batch, one step.
    ppo_mini_batch_size: int | None = None
    # STARE's settings, the section of the token method `stare` (the same object as methods["stare"]).
    stare: StareConfig = field(default_factory=StareConfig)
    # One settings section per registered token method, read and written as algo.<method name>
    # (stare_tir.config: `SECTIONS`); every registered method has one, at its defaults unless set.
    methods: dict[str, Any] = field(default_factory=dict)

    SECTIONS: ClassVar[tuple[str, Registry]] = ("methods", TOKEN_METHODS)

    def __post_init__(self) -> None:
        presets = algo_presets()
        if self.name not in presets:
            raise ValueError(f"name={self.name!r}: one of {', '.join(presets)}")
        ADVANTAGE_ESTIMATORS.check(self.advantage, "advantage")
        self._resolve_preset(presets[self.name])
        POLICY_LOSSES.check(self.policy_loss, "policy_loss")
        for method in self.token_methods:
            TOKEN_METHODS.check(method, "token_methods")
        if len(set(self.token_methods)) != len(self.token_methods):
            raise ValueError(f"token_methods={self.token_methods!r}: a method is listed twice; list each once")
        self.methods = {**self.methods, "stare": self.stare}  # one object: algo.stare is stare's section
        for entry in TOKEN_METHODS.entries():  # a section for every method, its defaults unless given
            if entry.config is not None and entry.name not in self.methods:
                self.methods[entry.name] = entry.config()
        if not 0.0 < self.clip_low <= 1.0:
            raise ValueError(f"clip_low={self.clip_low!r}: must be in (0, 1]")
        if not self.clip_high > 0.0:
            raise ValueError(f"clip_high={self.clip_high!r}: must be > 0")
        if self.dynamic_sampling_rounds < 1:
            raise ValueError(f"dynamic_sampling_rounds={self.dynamic_sampling_rounds!r}: must be >= 1")
        if self.ppo_epochs < 1:
            raise ValueError(f"ppo_epochs={self.ppo_epochs!r}: must be >= 1")
        if self.ratio_one_on_policy and self.ppo_epochs != 1:
            raise ValueError(
                f"ratio_one_on_policy with ppo_epochs={self.ppo_epochs}: old = current holds only for one "
                "update per batch; set algo.ppo_epochs=1 or algo.ratio_one_on_policy=false"
            )
        if self.tis_cap is not None and self.off_policy.enabled:
            raise ValueError(
                f"tis_cap={self.tis_cap!r} with off_policy.mode={self.off_policy.mode!r}: both weight the loss "
                "by pi_recompute / pi_rollout; keep one (algo.off_policy.mode=tis is tis_cap with options)"
            )
        if self.oversample < 1:
            raise ValueError(f"oversample={self.oversample!r}: must be >= 1")
        if self.round_end not in ("all", "enough"):
            raise ValueError(f"round_end={self.round_end!r}: one of all, enough")
        if self.ppo_mini_batch_size is not None and self.ppo_mini_batch_size < 1:
            raise ValueError(f"ppo_mini_batch_size={self.ppo_mini_batch_size!r}: must be >= 1 or null")

    def mini_batches(self, prompts_per_step: int) -> int:
        """Optimizer steps per epoch: prompts_per_step / ppo_mini_batch_size (1 when unset)."""
        if self.ppo_mini_batch_size is None:
            return 1
        if prompts_per_step % self.ppo_mini_batch_size:
            raise ValueError(
                f"algo.ppo_mini_batch_size={self.ppo_mini_batch_size} does not divide trainer.prompts_per_step="
                f"{prompts_per_step}; choose a divisor (verl requires the same)"
            )
        return prompts_per_step // self.ppo_mini_batch_size

    def _resolve_preset(self, preset: dict) -> None:
        """Fill every unset (None) setting from the preset, then from PRESET_DEFAULTS."""

        def value(key: str) -> object:
            v = preset.get(key, PRESET_DEFAULTS[key])
            return self.clip_low if v == "clip_low" else v

        if self.policy_loss is None:
            self.policy_loss = str(value("policy_loss"))
        if self.token_methods is None:
            self.token_methods = list(value("token_methods"))  # type: ignore[arg-type]
        elif self.name == "stare" and "stare" not in self.token_methods:  # STARE on top of the listed
            self.token_methods = [*self.token_methods, "stare"]
        if self.clip_high is None:
            self.clip_high = float(value("clip_high"))  # type: ignore[arg-type]
        if self.dynamic_sampling is None:
            self.dynamic_sampling = bool(value("dynamic_sampling"))
        if self.oversample is None:
            self.oversample = int(value("oversample"))  # type: ignore[call-overload]
        if self.overlong_penalty.enabled is None:
            self.overlong_penalty.enabled = bool(value("overlong_penalty"))
        if self.scope is None:
            self.scope = value("scope")  # type: ignore[assignment]


@dataclass
class TrainerConfig:
    # RL steps (one optimizer step per PPO epoch each).
    steps: int = 40
    # Prompts (GRPO groups) per step; each is rolled out rollout.n_per_prompt times.
    prompts_per_step: int = 16
    # With several learner ranks, move the scored trajectories between ranks so that each holds
    # about as many prompt + response tokens (Karmarkar-Karp, as verl's balance_batch;
    # stare_tir/trainer/rank_balance.py): the learner's collectives stop waiting for the rank that
    # rolled out the longest responses. The loss is normalised over all ranks, so a step of one
    # mini-batch updates the same either way (float summation order aside); what depends on the
    # placement (several mini-batches, micro_batch scope, a random method's draws) is listed there.
    # No effect with one process.
    balance_ranks: bool = True
    # Held-out evaluation every N steps (0: only before and after training).
    eval_every: int = 10
    # Samples per held-out problem in periodic evaluation.
    eval_n: int = 1
    # Checkpoint every N steps (and at the end); --resume continues from the latest.
    save_every: int = 10
    # Checkpoints kept on disk (oldest deleted first).
    keep_checkpoints: int = 2
    # Also export an HF-loadable model (weights + tokenizer, what AutoModelForCausalLM and SGLang
    # load) every N steps to <run_dir>/hf/step_NNNNNN; 0: only the final one (<run_dir>/final).
    save_hf_every: int = 0
    # Output directory: config.yaml, metrics.jsonl, checkpoints/, plots/, logs. It holds one run:
    # a new run into a used one is refused unless --resume (continue it) or --overwrite.
    run_dir: str = "runs/tiny_cpu"
    # Seed of rollout sampling (per step, round and rank) and of the held-out evaluation.
    seed: int = 0
    # Rollout backend, a name of `ROLLOUT_BACKENDS`: hf (in-process, CPU or one GPU) or sglang
    # (servers at rollout.sglang.urls).
    backend: str = field(default="hf", metadata={"choices": ROLLOUT_BACKENDS.names})
    # Asynchronous RL (eta): 0 is the synchronous loop (each step rolls out, then trains). eta >= 1
    # rolls out the batches of the next eta steps while this one trains, and trains only on
    # trajectories whose weights are at most eta versions older than those being updated
    # (stare_tir/trainer/async_rollouts.py). Not with colocated servers (they are asleep while the
    # learner trains). Pair it with algo.off_policy.
    max_staleness: int = 0
    # Stop with an error after this many consecutive non-finite steps (each one is skipped).
    max_nonfinite_steps: int = 3
    # Stop with an error after this many consecutive steps without a usable group (every rollout
    # failed, every group had equal rewards, or the filters dropped everything): such a run
    # would otherwise "finish" without ever training.
    max_empty_steps: int = 3
    # Mirror metrics.jsonl to TensorBoard (<run_dir>/tb); needs `pip install 'stare-tir[tracking]'`.
    tensorboard: bool = False
    # Mirror metrics.jsonl to this W&B project (a resumed run continues its W&B run); needs the
    # [tracking] extra and a W&B login.
    wandb_project: str | None = None
    # Write a few trajectories (prompt, text with code and interpreter output, reward, grade, finish
    # reason, weight version) to <run_dir>/samples/step_N.jsonl at step 1 and every N steps (0: never).
    samples_every: int = 10
    # Trajectories per samples file (one per group first, so different prompts show).
    samples_per_step: int = 4
    # The after-update entropy diagnostic (entropy/after_update, entropy/update_change: one more
    # no-grad forward over the batch with the updated weights, ~10% of a CPU step) every N steps
    # (0: never).
    diagnostics_every: int = 0

    def __post_init__(self) -> None:
        for name in (
            "steps",
            "prompts_per_step",
            "eval_n",
            "save_every",
            "keep_checkpoints",
            "max_nonfinite_steps",
            "max_empty_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")
        for name in (
            "eval_every",
            "save_hf_every",
            "max_staleness",
            "samples_every",
            "samples_per_step",
            "diagnostics_every",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 0")
        ROLLOUT_BACKENDS.check(self.backend, "backend")


@dataclass
class TrainConfig:
    # The user's own modules, imported before the rest of the config is validated: what they
    # register (token methods, advantage estimators, policy losses, graders, rollout and sandbox
    # backends) is then selectable by name, their settings are keys (stare_tir/plugins.py,
    # docs/extending.md). Dotted module names or .py paths; `--plugin MODULE` adds one.
    plugins: list[str] = field(default_factory=list)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    env: RetoolConfig = field(default_factory=RetoolConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sft: ColdStartConfig = field(default_factory=ColdStartConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        if self.data.fields.get("answer") == "" and not self.env.reward:
            raise ValueError(
                "data.fields.answer='' (rows without a gold answer) with no env.reward: the grader would mark "
                "every answer wrong; name a reward function of your own, env.reward=MODULE:FUNCTION"
            )
        check_sampling_matches_learner(self.rollout, self.learner, self.algo)
        self.algo.mini_batches(self.trainer.prompts_per_step)  # raises unless it divides
        if self.trainer.max_staleness > 0 and self.trainer.backend == "sglang" and self.rollout.sglang.colocate:
            raise ValueError(
                f"trainer.max_staleness={self.trainer.max_staleness} with rollout.sglang.colocate=true: colocated "
                "servers release their memory while the learner trains, so nothing can generate meanwhile; "
                "set trainer.max_staleness=0, or run the servers on their own GPUs (colocate=false)"
            )
        if self.algo.round_end == "enough" and self.trainer.max_staleness > 0:
            raise ValueError(
                f"algo.round_end=enough with trainer.max_staleness={self.trainer.max_staleness}: asynchronous "
                "rounds are rolled out ahead in full and cannot stop early; set algo.round_end=all, or "
                "trainer.max_staleness=0"
            )
        if self.algo.off_policy.enabled and (self.rollout.top_p < 1.0 or self.rollout.top_k > 0):
            raise ValueError(
                f"algo.off_policy.mode={self.algo.off_policy.mode!r} with rollout.top_p={self.rollout.top_p!r}, "
                f"rollout.top_k={self.rollout.top_k!r}: the behaviour log-probs of truncated sampling are not "
                "comparable with the learner's; set rollout.top_p=1.0 and rollout.top_k=-1, or "
                "algo.off_policy.mode=none"
            )


def check_sampling_matches_learner(rollout: RolloutConfig, learner: LearnerConfig, algo: AlgoConfig) -> None:
    """The learner must score tokens under the distribution the rollouts sampled from.

    Log-probs, entropy, STARE's surprisal and the TIS ratio are all computed by the learner as
    softmax(z / learner.temperature) over the full vocabulary. A different rollout temperature
    would make every one of them describe another distribution than the one sampled, silently.
    Nucleus / top-k sampling truncates the sampler's distribution, so rollout log-probs are not
    comparable with the learner's and truncated IS would correct towards the wrong target.
    """
    if rollout.temperature != learner.temperature:
        raise ValueError(
            f"rollout.temperature={rollout.temperature!r} but learner.temperature={learner.temperature!r}: "
            "the learner would score tokens under another distribution than the one sampled; "
            f"set both to the same value (e.g. learner.temperature={rollout.temperature!r})"
        )
    if algo.tis_cap is not None and (rollout.top_p < 1.0 or rollout.top_k > 0):
        raise ValueError(
            f"algo.tis_cap={algo.tis_cap!r} with rollout.top_p={rollout.top_p!r}, rollout.top_k={rollout.top_k!r}: "
            "truncated IS compares the sampler's truncated distribution with the learner's full one; "
            "set rollout.top_p=1.0 and rollout.top_k=-1, or algo.tis_cap=null"
        )
