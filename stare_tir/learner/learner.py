"""The learner: a DeepSpeed engine around a Hugging Face causal LM.

What it does for the RL loop (and for cold-start SFT):

- `compute_logprobs_entropy(trajs)`: the recompute pass. Log-probabilities and entropies of the
  response tokens the model wrote (loss_mask == 1), taken from the last hidden state and the
  lm_head weight in chunks (`algos.logprobs_and_entropy`), so [N, V] float32 logits never exist.
- `train_step(trajs, advantages, token_weights, old_logprobs, ...)`: one optimizer step of
  `algos.policy_loss`, token-mean over the GLOBAL batch (every micro-batch of every rank), with
  gradient accumulation over token-budget micro-batches.
- `sft_step(trajs)`: one optimizer step of token-mean NLL on loss_mask == 1 tokens.
- `export_weights()`, `save_checkpoint()` / `load_checkpoint()`, `save_hf()`.

Batching: token-budget micro-batches of right-padded rows (`stare_tir.learner.micro_batch`).

Loss scale. Each micro-batch loss is already divided by the global token count, so the sum of all
micro-batch losses of all ranks is the global token mean. DeepSpeed would (a) divide each
micro-batch loss by gradient_accumulation_steps and (b) average gradients over data-parallel ranks.
(a) is avoided with gradient_accumulation_steps=1 and a manual accumulation boundary; (b) is undone
by multiplying the loss by the data-parallel world size before backward. Tests check the result
against 1 process and against other micro-batch splits.

Non-finite steps are decided here, before `engine.step()`, from all-reduced loss flags and a
gradient-norm bound, and skipped without touching weights or optimizer state (`step_guard`).

Collectives. Under ZeRO-3 every forward all-gathers parameters and under ZeRO-2 every backward
reduces gradients, so all ranks must run the same number of micro-batches: ranks with fewer pad
with an empty (zero-loss) micro-batch.

Supported DeepSpeed paths (each tested on CPU by tests/learner/test_learner_paths.py, with a
normal step, an all-zero-gradient step, a skipped non-finite step and the recovery after it):
ZeRO 0-3 in fp32 and bf16 (bf16 at stage 0 with learner.grad_accum_dtype=bf16, which DeepSpeed
0.19 requires there), optimizer state offloaded to the CPU at ZeRO 1-3, and parameters offloaded
too at ZeRO-3. DeepSpeed versions: deepspeed_config.TESTED_DEEPSPEED.
"""

from __future__ import annotations

import contextlib
import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Sequence

from stare_tir.learner.checkpoint_layout import (
    UNIVERSAL_TAG,
    load_layout,
    needs_universal,
    save_layout,
    universal_checkpoint,
)
from stare_tir.learner.collectives import RankCollectives
from stare_tir.learner.config import LearnerConfig, cpu_has_bf16
from stare_tir.learner.deepspeed_config import merge_deepspeed_config, offload_devices, warn_if_untested
from stare_tir.learner.distributed import (
    cuda_device_index,
    export_launch_env,
    give_deepspeed_groups_timeout,
    init_process_group,
    rng_state,
    seed_all,
    set_rng_state,
    skip_shm_comm_build,
)
from stare_tir.learner.micro_batch import (
    MicroBatch,
    as_long_list,
    build_micro_batch,
    empty_micro_batch,
    plan_micro_batches,
)
from stare_tir.learner.parts import RlStepClock, has_dropout, lr_lambda, token_logprob_model
from stare_tir.learner.policy_step import narrow_forward, policy_loss_fn, scatter_rows
from stare_tir.learner.step_guard import GradNormBound, discard_partition_gradients, frozen_update, step_is_finite

if TYPE_CHECKING:  # torch, transformers and deepspeed are imported where used: LearnerConfig
    from torch import Tensor, nn  # stays importable by light paths (CLI --help, config loading)
    from transformers import PreTrainedTokenizerBase

    from stare_tir.algos.policy_loss import Clip, LossInputs


class Learner(RankCollectives):
    """A DeepSpeed engine around an HF causal LM; see the module docstring.

    Every rank constructs one and calls every method with its own share of the batch: all methods
    except micro_batch_plan and shard are collective. Trajectory-like inputs need `prompt_ids`,
    `response_ids`, `loss_mask` (lists or 1-D tensors; loss_mask as long as response_ids) and, for
    truncated importance sampling, `rollout_logprobs`.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        cfg: LearnerConfig,
        tokenizer: PreTrainedTokenizerBase | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        import deepspeed
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if cfg.lr_scheduler != "constant" and cfg.total_steps == 0:
            raise ValueError(f"total_steps=0: lr_scheduler={cfg.lr_scheduler!r} needs the run length")
        self.cfg = cfg
        logging.getLogger("DeepSpeed").setLevel(cfg.deepspeed_log_level.upper())
        warn_if_untested(deepspeed.__version__)
        launch = export_launch_env()  # srun / mpirun variables -> RANK, WORLD_SIZE, LOCAL_RANK, ...
        on_cuda = torch.cuda.is_available()
        if on_cuda:
            torch.cuda.set_device(cuda_device_index(launch))
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
            skip_shm_comm_build()
        timeout = timedelta(minutes=cfg.dist_timeout_minutes)
        init_process_group("nccl" if on_cuda else "gloo", timeout)
        deepspeed.init_distributed(dist_backend="nccl" if on_cuda else "gloo", timeout=timeout)
        give_deepspeed_groups_timeout(timeout)  # before deepspeed.initialize creates its groups
        import torch.distributed as dist

        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        seed_all(cfg.seed + self.rank)

        self.bf16 = cfg.bf16(on_cuda)
        if self.bf16 and not on_cuda and not cpu_has_bf16():
            logging.getLogger(__name__).warning(
                "learner.dtype=bf16 on a CPU without avx512_bf16/amx_bf16: bf16 is emulated here and slower "
                "than fp32; set learner.dtype=fp32"
            )
        self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(str(model_path))
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))

        ds_config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 1,
            # 1, with the accumulation boundary set by hand: DeepSpeed must not divide the loss by
            # a fixed step count (our micro-batch count varies with sequence lengths).
            "gradient_accumulation_steps": 1,
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": {"stage": cfg.zero_stage},
            "bf16": {"enabled": self.bf16},
            "data_types": {"grad_accum_dtype": cfg.accum_dtype() if self.bf16 else "fp32"},
            "zero_allow_untested_optimizer": True,  # our torch.optim.AdamW (no CPU-Adam compile)
            "zero_force_ds_cpu_optimizer": False,  # offloaded: torch's fused CPU AdamW, see below
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }
        if cfg.zero_stage == 3:
            ds_config["zero_optimization"]["stage3_param_persistence_threshold"] = cfg.zero3_persistence_threshold
        ds_config = merge_deepspeed_config(ds_config, cfg.deepspeed)  # learner.deepspeed pass-through
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        # Every rank loads the full model on CPU; under ZeRO-3 deepspeed.initialize then partitions
        # it (host memory: one model copy per rank, transiently). Loading straight into partitions
        # (zero.Init through transformers' HfDeepSpeedConfig + accelerate) was measured and not
        # adopted: for a 155M-parameter model on 2 CPU ranks its peak RSS per rank was 1918 MB
        # against 1551 MB here, since each rank still reads the whole checkpoint to fill its shard.
        lm = AutoModelForCausalLM.from_pretrained(
            str(model_path),
            dtype=dtype,
            attn_implementation=cfg.attn_implementation,
            trust_remote_code=trust_remote_code,
        )  # model.trust_remote_code
        if cfg.gradient_checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self._module = token_logprob_model(lm, cfg.temperature, cfg.logprob_chunk_size)
        if cfg.zero_stage == 3:
            deepspeed.zero.register_external_parameter(self._module, lm.get_output_embeddings().weight)

        # With the optimizer offloaded, its step runs on the CPU over fp32 masters: torch's fused
        # AdamW kernel is ~5x faster there than the default foreach one and as fast as DeepSpeed's
        # CPU Adam, which needs a C++ build first (scripts/bench/bench_cpu_adam.py).
        offloaded = offload_devices(cfg.deepspeed)[0] == "cpu"
        optimizer = torch.optim.AdamW(
            self._module.parameters(),
            lr=cfg.lr,
            betas=tuple(cfg.betas),
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            fused=True if offloaded else None,
        )
        self.lr_clock = RlStepClock()  # advanced by the trainer under learner.schedule_unit rl_step
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lr_lambda(
                cfg.warmup_steps, cfg.total_steps, cfg.lr_scheduler, cfg.min_lr_ratio, cfg.schedule_unit, self.lr_clock
            ),
        )
        # bf16 without ZeRO wraps the optimizer in FP16_UnfusedOptimizer, whose constructor takes a
        # real optimizer step on zero gradients (runtime/fp16/unfused_optimizer.py
        # `initialize_optimizer_states`): Adam's step count starts at 1 and weight decay shrinks the
        # fp32 masters once before training. Frozen, that step does nothing.
        frozen = frozen_update(optimizer) if cfg.zero_stage == 0 and self.bf16 else contextlib.nullcontext()
        try:
            with frozen:
                self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
                    model=self._module, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
                )
        except NotImplementedError as e:
            # Without ZeRO, bf16 supports one accumulation dtype, and which one depends on the
            # version (engine.py `_do_optimizer_sanity_check`: 0.16 wants fp32, 0.19 bf16).
            raise ValueError(
                f"DeepSpeed {deepspeed.__version__} refuses learner.zero_stage={cfg.zero_stage} with "
                f"bf16 and learner.grad_accum_dtype={cfg.grad_accum_dtype} ({e}). Use "
                "learner.zero_stage=1 (fp32 accumulation, same math) or the other "
                "learner.grad_accum_dtype"
            ) from e
        self.engine.train()
        self._base_optimizer = optimizer  # ours: a skipped step freezes its step() (step_guard)
        self._norm_bound = GradNormBound(self._module.parameters(), self.device)
        self.steps_applied = 0  # optimizer steps actually taken
        self.steps_skipped = 0  # steps skipped for a non-finite loss or gradient

    def micro_batch_plan(self, trajs: Sequence[Any], forward_only: bool = False) -> list[list[int]]:
        """Indices of `trajs` per micro-batch, exactly as train_step / the recompute pass form them."""
        budget = self.cfg.micro_batch_tokens
        if forward_only:
            budget = self.cfg.forward_micro_batch_tokens or 2 * self.cfg.micro_batch_tokens
        lengths = [len(as_long_list(t.prompt_ids)) + len(as_long_list(t.response_ids)) for t in trajs]
        return plan_micro_batches(lengths, budget)

    def _micro_batches(self, trajs: Sequence[Any], forward_only: bool) -> list[MicroBatch]:
        """Micro-batches of this rank, padded with empty ones to the largest count over ranks."""
        import torch

        plan = self.micro_batch_plan(trajs, forward_only)
        mbs = [build_micro_batch(trajs, idx, self.pad_id) for idx in plan]
        n_max = int(self.all_reduce_max(torch.tensor([len(mbs)])).item())
        mbs += [empty_micro_batch(self.pad_id) for _ in range(n_max - len(mbs))]
        return mbs

    def _forward(self, mb: MicroBatch, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        d = mb.to(self.device)
        return self.engine(
            d.input_ids, d.attention_mask, d.position_ids, d.sel_rows, d.sel_pos, d.targets, with_entropy=with_entropy
        )

    # ------------------------------------------------------------------ recompute pass

    def compute_logprobs_entropy(self, trajs: Sequence[Any]) -> tuple[list[Tensor], list[Tensor]]:
        """Log-probs and entropies of every trajectory's response tokens under the current policy.

        Returns two lists (one float32 CPU tensor per trajectory, length len(response_ids)), with
        values on loss_mask == 1 tokens and 0.0 on the rest (the rollout_logprobs convention).
        """
        import torch

        logps: list = [None] * len(trajs)
        ents: list = [None] * len(trajs)
        was_training = self.engine.training
        self.engine.eval()  # no dropout: these are the "old" log-probs the update compares to
        try:
            with torch.no_grad():
                for mb in self._micro_batches(trajs, forward_only=True):
                    lp, ent = self._forward(mb, with_entropy=True)
                    scatter_rows(mb, trajs, lp, ent, logps, ents)
        finally:
            self.engine.train(was_training)
        return logps, ents

    def update_micro_batches(self, trajs: Sequence[Any]) -> int:
        """The most update micro-batches any rank forms for its `trajs` (collective)."""
        import torch

        return int(self.all_reduce_max(torch.tensor([len(self.micro_batch_plan(trajs))])).item())

    def forward_is_deterministic(self) -> bool:
        """Whether the training forward equals the recompute pass's eval forward (no dropout)."""
        return not has_dropout(self._module, getattr(self.model, "config", None))

    # ------------------------------------------------------------------ update passes

    def train_step(
        self,
        trajs: Sequence[Any],
        advantages: Sequence[float | Tensor],
        token_weights: Sequence[Tensor] | None = None,
        old_logprobs: Sequence[Tensor] | None = None,
        *,
        clip: Clip | None = None,
        loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean",
        tis_cap: float | None = None,
        loss_fn: Callable[[LossInputs], tuple[Tensor, dict]] | None = None,
        terms: dict[str, Sequence[Tensor]] | None = None,
        record: tuple[list, list] | None = None,
        forwarded: tuple[list[MicroBatch], list[Tensor]] | None = None,
    ) -> dict[str, float]:
        """One optimizer step of a policy loss over this rank's `trajs`.

        advantages: per trajectory a float (broadcast over its tokens) or a response-length tensor;
        token_weights (STARE's omega, None: all ones) likewise per trajectory; terms: the token methods'
        named per-token terms (KL-Cov's `kl_cov`), each per trajectory, handed to the loss by name.
        old_logprobs: from compute_logprobs_entropy (None: the current policy's, i.e. ratio 1).
        clip: the trust region (None: `Clip()`); tis_cap: truncated IS of old (the update's own
        log-probs when old_logprobs is None) against the rollout log-probs.
        loss_fn: a registered policy loss (POLICY_LOSSES, algo.policy_loss; None: `clip_loss`).
        record: two lists of len(trajs) that receive, per trajectory, the update forward's own
        log-probs and entropies (detached, before the step; compute_logprobs_entropy's layout), so
        an on-policy step needs no recompute pass for its metrics. forwarded: the micro-batches of
        `trajs` and their log-probs, already run (train_step_on_policy; no forward here then).
        The loss is aggregated over the global batch (all micro-batches, all ranks).
        """
        mb_loss = policy_loss_fn(
            self.device, trajs, advantages, token_weights, old_logprobs, clip, loss_agg, tis_cap, loss_fn, terms
        )
        mbs, logps = forwarded if forwarded is not None else (None, None)
        return self._optimizer_step(trajs, mb_loss, record=record, mbs=mbs, forwarded=logps)

    def train_step_on_policy(
        self,
        trajs: Sequence[Any],
        shape: Callable[[list[Tensor], list[Tensor]], dict[str, Any]],
        **loss_options: Any,
    ) -> tuple[dict[str, float], list[Tensor], list[Tensor]]:
        """One on-policy optimizer step whose inputs are made from its own forward: one forward
        (with entropies), then `shape(logprobs, entropies)` (per trajectory, detached, the layout of
        compute_logprobs_entropy) returns train_step's per-trajectory arguments (trajs, a loss mask
        may narrow; advantages; token_weights; terms; tis_cap), then the loss on the same forward
        with old = its own log-probs, detached (ratio 1 in value, the gradient intact), the backward
        and the step. Saves the recompute pass when a selection needs the batch's entropies first.

        Every rank's `trajs` must fit one update micro-batch (`update_micro_batches` == 1: the
        selection may span the whole batch, and one forward's graph is all that is kept); `shape`
        runs on every rank (it may hold collectives). loss_options: train_step's clip, loss_agg,
        loss_fn. Returns train_step's metrics and the forward's log-probs and entropies.
        """

        mbs = self._micro_batches(trajs, forward_only=False)
        if len(mbs) != 1:
            raise ValueError(
                f"train_step_on_policy: the batch takes {len(mbs)} update micro-batches on some rank; it needs "
                "one (raise learner.micro_batch_tokens, or take the recompute pass: algo.recompute=always)"
            )
        mb = mbs[0]
        logps: list = [None] * len(trajs)
        ents: list = [None] * len(trajs)
        self.engine.set_gradient_accumulation_boundary(True)
        logp, ent = self._forward(mb, with_entropy=True)
        scatter_rows(mb, trajs, logp.detach(), ent, logps, ents)
        args = shape(logps, ents)
        new_trajs = args.pop("trajs")
        mb, logp = narrow_forward(mb, logp, new_trajs, self.pad_id)
        known = ("advantages", "token_weights", "tis_cap", "terms")
        if set(args) - set(known):
            raise TypeError(f"train_step_on_policy: shape returned unknown arguments {sorted(set(args) - set(known))}")
        # old = its own log-probs, detached; through train_step, the one door to the loss
        kwargs = {k: args[k] for k in ("tis_cap", "terms") if k in args}
        result = self.train_step(
            new_trajs,
            args["advantages"],
            args.get("token_weights"),
            None,
            forwarded=([mb], [logp]),
            **kwargs,
            **loss_options,
        )
        return result, logps, ents

    def sft_step(self, trajs: Sequence[Any]) -> dict[str, float]:
        """One optimizer step of token-mean NLL over loss_mask == 1 tokens (global batch)."""

        def loss_fn(mb: MicroBatch, logp: Tensor, denom_tok: float, denom_seq: float) -> tuple[Tensor, dict]:
            return -logp.float().sum() / denom_tok, {}

        return self._optimizer_step(trajs, loss_fn)

    def _optimizer_step(
        self,
        trajs: Sequence[Any],
        loss_fn: Callable[..., tuple[Tensor, dict]],
        *,
        record: tuple[list, list] | None = None,
        mbs: list[MicroBatch] | None = None,
        forwarded: list[Tensor] | None = None,
    ) -> dict[str, float]:
        """Accumulate gradients over all micro-batches, then one optimizer step (or a skip).
        record: see train_step. mbs, forwarded: the micro-batches and their forwards' log-probs,
        already run (train_step_on_policy)."""
        import torch

        mbs = mbs if mbs is not None else self._micro_batches(trajs, forward_only=False)
        if not mbs:
            raise ValueError("no trajectories on any rank: nothing to train on")
        local_tok = sum(mb.num_tokens for mb in mbs)
        local_seq = sum(int((mb.mask.sum(-1) > 0).sum()) for mb in mbs)
        glob = self.all_reduce_sum(torch.tensor([local_tok, local_seq], dtype=torch.float64))
        g_tok, g_seq = max(float(glob[0]), 1.0), max(float(glob[1]), 1.0)
        lr = float(self.engine.get_lr()[0])

        loss_sum = torch.zeros((), dtype=torch.float64)
        nonfinite = 0.0
        self._norm_bound.reset()
        sums: dict[str, float] = {}  # token-weighted sums of the loss function's mean metrics
        ratio_max = 0.0
        for k, mb in enumerate(mbs):
            self.engine.set_gradient_accumulation_boundary(k == len(mbs) - 1)
            if forwarded is not None:
                logp = forwarded[k]
            else:
                logp, ent = self._forward(mb, with_entropy=record is not None)
                if record is not None:
                    scatter_rows(mb, trajs, logp.detach(), ent, *record)
            if mb.num_tokens == 0:
                loss, metrics = logp.float().sum() * 0.0, {}  # collective filler: zero gradient
            else:
                loss, metrics = loss_fn(mb.to(self.device), logp, g_tok, g_seq)
            if not torch.isfinite(loss.detach()):
                nonfinite = 1.0  # still backward it: ZeRO's reductions need every rank's backward
            # DeepSpeed averages gradients over data-parallel ranks; our loss is already a share
            # of the global mean, so scale the average back up to the sum.
            self.engine.backward(loss * self.world_size)
            loss_sum += float(loss.detach())
            for key, val in metrics.items():
                if key == "pg/ratio_max":
                    ratio_max = max(ratio_max, val)
                elif key not in ("pg/loss", "pg/num_tokens"):
                    sums[key] = sums.get(key, 0.0) + val * mb.num_tokens

        names = sorted(sums)
        if self.world_size > 1:  # a rank whose share was empty has no metric names: agree on them
            import torch.distributed as dist

            every = [None] * self.world_size
            dist.all_gather_object(every, names)
            names = sorted(set().union(*every))
        # Sums of every rank, in one all-reduce: loss, non-finite-loss flags, gradient-norm bounds
        # (step_guard), metrics. The skip is decided from them, identically on every rank.
        bound = self._norm_bound.total.to(torch.float64).cpu()
        red = self.all_reduce_sum(
            torch.cat(
                [
                    torch.tensor([float(loss_sum), nonfinite], dtype=torch.float64),
                    bound.reshape(1),
                    torch.tensor([sums.get(k, 0.0) for k in names], dtype=torch.float64),
                ]
            )
        )
        nonfinite_loss, norm_bound = float(red[1]), float(red[2]) / self.world_size
        if step_is_finite(nonfinite_loss, norm_bound):
            grad_norm = self._step()
        else:  # DeepSpeed's end-of-step path discards the gradients; weights and Adam stay as they are
            with frozen_update(self._base_optimizer, self.scheduler):
                self.engine.step()
            discard_partition_gradients(self.engine.optimizer)  # what 0.19.8 keeps with offload
            grad_norm = None
        applied = grad_norm is not None
        if applied:
            self.steps_applied += 1
        else:
            self.steps_skipped += 1
        out = {
            "loss": float(red[0]),
            "grad_norm": float("nan") if grad_norm is None else grad_norm,
            "lr": lr,
            "tokens": g_tok,
            "sequences": g_seq,
            "micro_batches": float(len(mbs)),
            "step_skipped": 0.0 if applied else 1.0,
            "nonfinite_loss": 1.0 if nonfinite_loss > 0 else 0.0,
            "grad_norm_bound": norm_bound,
        }
        for k, name in enumerate(names):
            out[name] = float(red[3 + k]) / g_tok
        if names:
            out["pg/ratio_max"] = float(self.all_reduce_max(torch.tensor([ratio_max])).item())
        return out

    def _step(self) -> float | None:
        """Optimizer step of a step judged finite. Returns the global grad norm (pre-clip), or
        None if DeepSpeed skipped the step after all (its own overflow check).

        Stage 0 with fp32 hands the plain torch optimizer the already all-reduced gradients and
        records no norm, so it is computed here.
        """
        import torch

        norm = None
        if self.cfg.zero_stage == 0 and not self.bf16:
            grads = [p.grad for p in self._module.parameters() if p.grad is not None]
            norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
        self.engine.step()
        if not self.engine.was_step_applied():
            logging.getLogger(__name__).warning("DeepSpeed skipped a step whose loss and gradient bound were finite")
            return None
        if norm is None:
            ds_norm = self.engine.get_global_grad_norm()
            norm = float("nan") if ds_norm is None else float(ds_norm)
        return norm

    # ------------------------------------------------------------------ weights and checkpoints

    @property
    def model(self) -> nn.Module:
        """The HF model (parameters are partitioned placeholders under ZeRO-3)."""
        return self._module.lm

    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        """Yield (HF parameter name, full tensor) for every parameter, e.g. for the rollout backend.

        Collective under ZeRO-3 (every rank must iterate it to the end, also when its consumer
        failed): each parameter is gathered, cloned and released in turn, so only one full
        parameter exists at a time. Under ZeRO 0-2 each tensor is a clone as well: the parameters
        are views into DeepSpeed's live flat buffers, which a consumer must never hold (a CUDA IPC
        handle to a view shares the whole buffer with the rollout server).
        """
        import deepspeed

        for name, p in self.model.named_parameters():
            if self.cfg.zero_stage == 3:
                with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                    t = p.detach().clone()
                yield name, t
            else:
                yield name, p.detach().clone()

    def save_checkpoint(self, directory: str | os.PathLike, client_state: dict | None = None) -> None:
        """Save everything to resume exactly: model, optimizer, LR scheduler (DeepSpeed), the caller's
        client_state (token method states, data position, ...), step counters, and each rank's RNG states.

        Collective: every rank calls it with the same directory (on a shared filesystem).
        """
        import deepspeed
        import torch
        import torch.distributed as dist

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {
            "client_state": client_state or {},
            "steps_applied": self.steps_applied,
            "steps_skipped": self.steps_skipped,
        }
        self.engine.save_checkpoint(str(directory), tag="deepspeed", client_state={"learner": state}, save_latest=False)
        torch.save(rng_state(), directory / f"rng_rank{self.rank}.pt")
        if self.rank == 0:  # a resume on another number of ranks reads it (checkpoint_layout)
            save_layout(directory, self.world_size, self.cfg.zero_stage, deepspeed.__version__)
        dist.barrier()

    def load_checkpoint(self, directory: str | os.PathLike) -> dict:
        """Restore what save_checkpoint wrote; returns client_state.

        The ZeRO stage must be the one saved. Another number of ranks is fine: a ZeRO-1/2/3
        checkpoint is then converted once to DeepSpeed's universal checkpoint and loaded from there
        (`checkpoint_layout`), with the same weights, optimizer state and schedule.
        """
        import torch

        directory = Path(directory)
        if not (directory / "deepspeed").is_dir():
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory}/deepspeed")
        layout = load_layout(directory)
        tag = "deepspeed"
        if needs_universal(layout, self.world_size, self.cfg.zero_stage):
            universal_checkpoint(directory, self.rank, layout["world_size"], self.world_size, self.all_reduce_sum)
            tag = UNIVERSAL_TAG
        # engine.py `load_checkpoint` reads `_config.load_universal_checkpoint` at load time only; the
        # engine was built before the checkpoint's layout was known, so the flag is set for this call.
        config = self.engine._config
        before = config.load_universal_checkpoint
        config.load_universal_checkpoint = tag == UNIVERSAL_TAG
        try:
            path, ds_client = self.engine.load_checkpoint(
                str(directory), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
            )
        finally:
            config.load_universal_checkpoint = before
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory}/{tag}")
        state = ds_client["learner"]
        self.steps_applied, self.steps_skipped = state["steps_applied"], state["steps_skipped"]
        rng_file = directory / f"rng_rank{self.rank}.pt"
        if rng_file.exists():
            set_rng_state(torch.load(rng_file, weights_only=False))
        return state["client_state"]

    def save_hf(self, directory: str | os.PathLike) -> None:
        """Write an ordinary HF model directory (config, weights, tokenizer) on rank 0.

        Loadable by AutoModelForCausalLM.from_pretrained and by the rollout backends. Collective
        under ZeRO-3 (weights are gathered one parameter at a time).
        """
        import torch.distributed as dist

        directory = Path(directory)
        if self.cfg.zero_stage == 3:
            state = {}
            for name, t in self.export_weights():
                if self.rank == 0:
                    state[name] = t.cpu()
        else:
            state = None
        if self.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(str(directory), state_dict=state)
            self.tokenizer.save_pretrained(str(directory))
        dist.barrier()
