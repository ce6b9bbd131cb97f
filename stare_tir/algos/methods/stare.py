"""STARE as a token method: the entry `stare` (algo.name=stare, settings algo.stare.*) whose state is
the target-entropy controller (gate, W and M under the adaptive schedule), checkpointed with the run.

The selection itself is `stare_tir.algos.stare` (the arithmetic checked against the authors' code);
this entry only feeds it one selection group at a time and logs the `stare/*` metrics. torch and the
tensor code are imported on first use, so a config reads this registry without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stare_tir.algos.stare_config import StareConfig
from stare_tir.algos.token_methods import TOKEN_METHODS, TokenEffect, TokenInputs

if TYPE_CHECKING:
    from stare_tir.algos.stare import StareController

# Per-group counts a STARE effect carries in its metrics, summed into the step's `stare/*` metrics.
_COUNTS = ("tokens", "cand_pos", "cand_neg", "sel_pos", "sel_neg")


@TOKEN_METHODS.register("stare", config=StareConfig)
class Stare:
    """STARE (see `stare_tir.algos.stare`): omega = W on L+, M on L- (C2), 1 elsewhere, while the
    controller's gate is on.

    `observe(H)` moves the controller once per step (gate, adaptive W/M); while the gate is off (or
    algo.stare.enabled is false) the method is inactive: the trainer selects nothing for it and the
    update is exactly GRPO-ds's. Its weight multiplies the other methods' (it is listed last for
    algo.name=stare, "on top"); it selects T+ and T- by the sign of the advantages it is given, which
    the built-in methods before it never change. Metrics: `stare/*` over the whole step (counts summed
    over the selection groups), the controller's, `stare/gate_on`, and `stare/lplus_s_gt_h_frac`.
    """

    def __init__(self, cfg: StareConfig) -> None:
        from stare_tir.algos.stare import StareController

        self.enabled = cfg.enabled
        self.controller: StareController = StareController.from_config(cfg)

    @property
    def active(self) -> bool:
        """Whether it selects this step: enabled and the gate open."""
        return self.enabled and self.controller.gate_on

    def observe(self, batch_entropy: float) -> None:
        if self.enabled:
            self.controller.update(batch_entropy)

    def __call__(self, t: TokenInputs, cfg: StareConfig) -> TokenEffect:
        from stare_tir.algos.stare import stare_group_weights

        c = self.controller
        omega, counts = stare_group_weights(
            -t.logprobs, t.advantages, top_p=cfg.top_p, w=c.w, m=c.m, variant=cfg.variant
        )
        # L+ tokens whose surprisal exceeds their position's entropy (the only ones whose reinforcement
        # raises it: dH/dz_a = p_a (-log p_a - H)), under the policy the selection used.
        lplus = (omega == c.w) & (t.advantages > 0)
        counts["lplus"] = int(lplus.sum())
        counts["lplus_raising"] = int(((-t.logprobs > t.entropy) & lplus).sum())
        return TokenEffect(selected=omega != 1.0, weights=omega, metrics=counts)

    def step_metrics(self, effects: list[TokenEffect]) -> dict[str, float | None]:
        """The step's `stare/*` metrics from its effects over every selection group ([] when inactive)."""
        from stare_tir.algos.stare import stare_metrics

        if not self.enabled:
            return {}
        c = self.controller
        if not c.gate_on:
            out: dict[str, float | None] = {"stare/reweighted_frac": 0.0, "stare/mean_weight": 1.0}
        else:
            total = {k: sum(e.metrics[k] for e in effects) for k in (*_COUNTS, "lplus", "lplus_raising")}
            out = dict(stare_metrics({k: total[k] for k in _COUNTS}, c.w, c.m))
            # None when W == 1 (L+ not marked) or L+ is empty.
            lplus = total["lplus"] if c.w != 1.0 else 0
            out["stare/lplus_s_gt_h_frac"] = total["lplus_raising"] / lplus if lplus > 0 else None
        out.update(c.metrics())
        out["stare/gate_on"] = float(c.gate_on)
        return out

    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state)
