"""Token methods: what a method sees and returns, the registry that finds them by name, the helpers
they share, how their effects compose, and the per-run instances of the methods that keep state.

The methods themselves live one per file in `stare_tir/algos/methods/` (the STARE paper's baselines,
EAPO, STEER and STARE itself). A method is either a plain function registered with its settings
dataclass,

    @TOKEN_METHODS.register("kl_cov", config=KLCovConfig)
    def kl_cov(t: TokenInputs, cfg: KLCovConfig) -> TokenEffect: ...

or a class registered the same way when it keeps state across steps (`StatefulMethod`): the trainer
builds one instance per run, `cls(cfg)`, calls `observe(batch_entropy)` once per step before any
selection, calls the instance like the function above, and checkpoints `state_dict()` with the run
(`RunMethods`). STARE's controller and EAPO's initial entropy are such state. Either is then
selectable by `algo.token_methods=[name]`, its settings under `algo.<name>.*`, with a preset
`algo.name=<name>` (GRPO-ds plus the method, and the settings' `preset`).

Every method sees the loss tokens (model-written tokens) of one selection group as flat tensors in a
fixed order (`TokenInputs`): the log-probability of the sampled token and the entropy at its position
under the policy of this step (from the recompute pass; equal to the update pass's own at the first
update), its advantage, and a seeded generator. It returns a `TokenEffect`:

    advantages  shaped advantages (None: unchanged)
    weights     constant factors >= 0 on the per-token loss (None: all 1); 0 silences a token while
                it stays in the loss's normaliser (verl's `corr = 0` of Clip-Cov)
    keep        tokens that stay in the loss (None: all); a removed token has exactly zero gradient
                and leaves the normaliser too ("renormalise": 80/20 rule, STAPO)
    terms       named per-token terms for the policy loss, which reads its own by name (KL-Cov's
                coefficient of |log pi - log pi_old| is the term `kl_cov`); None: none
    selected    the tokens the method selected or changed (logged as algo/selected_frac)

With its selection empty or its coefficient 0 each method returns no change at all, so the update is
GRPO-ds's bit for bit (tests/algos/test_algos_token_methods.py). Selections are exact: counts follow
the stated formulas, ties at a threshold go to the lower position. Where a paper and its code differ,
the code is followed and the docstring says so. Selection runs once per mini-batch with the current
policy's log-probs and entropies, as verl selects inside the loss on every mini-batch: on the first
(on-policy) mini-batch those of the recompute pass, on later ones those of a no-grad pass over the
mini-batch after the earlier optimizer steps (`trainer/mini_batches.py`). The authors' code does
this inside the loss for KL-Cov, Clip-Cov, the 80/20 rule and STEER (and STARE); for the entropy
advantage and STAPO it was not checked, and they re-select the same way. Methods applied together
compose by `combine_effects`.

torch is imported inside the functions: the config and `--help` read this registry (names and
settings) without loading torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import Tensor


@dataclass
class TokenEffect:
    """What a token method does to the loss tokens of one selection group (see the module docstring)."""

    selected: Tensor  # [N] bool
    advantages: Tensor | None = None  # [N] float
    weights: Tensor | None = None  # [N] float, >= 0
    keep: Tensor | None = None  # [N] bool
    terms: dict[str, Tensor] | None = None  # name -> [N] float, read by the policy loss by name
    metrics: dict = field(default_factory=dict)


@dataclass
class TokenInputs:
    """The loss tokens of one selection group, flat and in a fixed order."""

    logprobs: Tensor  # [N] log pi of the sampled token under the current policy
    entropy: Tensor  # [N] entropy at the token's position under the current policy
    advantages: Tensor  # [N] the trajectory's advantage (as shaped by the methods before this one)
    generator: torch.Generator | None = None  # seeded per step and group (random selections)
    # [N] log pi_old, the rollout batch's stored log-probs; None: equal to logprobs (the first,
    # on-policy mini-batch of a step). Later mini-batches see the policy after earlier updates.
    old_logprobs: Tensor | None = None
    # The step's token-mean policy entropy (global batch, recompute pass); None where the trainer
    # does not give it (unit calls).
    batch_entropy: float | None = None


TokenMethodFn = Callable[[TokenInputs, Any], TokenEffect]


@runtime_checkable
class StatefulMethod(Protocol):
    """A token method with state across steps, registered as a class and built once per run with its
    settings (`cls(cfg)`). Optional besides these: `active` (a bool property; False: nothing is
    selected for it this step, e.g. STARE's gate is off) and `step_metrics(effects) -> dict` (the
    step's metrics from its effects over every selection group, logged instead of the generic
    `algo/<name>/*`; called with [] when inactive)."""

    def observe(self, batch_entropy: float) -> None:
        """Once per step, before any selection: the step's batch entropy (may be NaN)."""

    def __call__(self, t: TokenInputs, cfg: Any) -> TokenEffect: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


# algo.token_methods: methods by name, each registered with its settings dataclass. The modules
# that register the built-in ones, in the order their names are listed.
METHOD_MODULES = tuple(
    f"stare_tir.algos.methods.{name}"
    for name in ("kl_cov", "clip_cov", "entropy_80_20", "entropy_adv", "stapo", "steer", "eapo", "stare")
)
TOKEN_METHODS: Registry[Any] = Registry("token method", load=METHOD_MODULES)


def ceil_frac(frac: float, n: int) -> int:
    """ceil(frac * n) computed exactly in decimal (0.2 * 15 is 3, not 4), at least 1 when n > 0."""
    if n <= 0:
        return 0
    return max(1, math.ceil(Fraction(repr(float(frac))) * n))


def floor_frac(frac: float, n: int) -> int:
    """max(1, int(frac * n)) as verl computes it (float product, truncated), for n > 0."""
    return max(1, int(n * frac)) if n > 0 else 0


def top_k_positions(values: Tensor, k: int) -> Tensor:
    """Positions of exactly k largest entries (ties at the threshold go to the lower position).
    O(N): the threshold is the k-th largest value (one selection, no sort)."""
    import torch

    n = values.numel()
    if k <= 0:
        return torch.zeros(0, dtype=torch.long, device=values.device)
    if k >= n:
        return torch.arange(n, device=values.device)
    threshold = torch.kthvalue(values, n - k + 1).values  # the k-th largest
    above = torch.nonzero(values > threshold).squeeze(1)
    ties = torch.nonzero(values == threshold).squeeze(1)[: k - above.numel()]
    return torch.sort(torch.cat([above, ties])).values


def quantile(values: Tensor, q: float) -> float:
    """torch.quantile's linear-interpolation quantile by two selections instead of a sort."""
    import torch

    n = values.numel()
    pos = q * (n - 1)
    lo, frac = int(pos), pos - int(pos)
    a = torch.kthvalue(values, lo + 1).values
    if frac == 0.0 or lo + 1 >= n:
        return float(a)
    b = torch.kthvalue(values, lo + 2).values
    return float(a + (b - a) * frac)


def mask_at(n: int, positions: Tensor, device: torch.device) -> Tensor:
    import torch

    out = torch.zeros(n, dtype=torch.bool, device=device)
    out[positions] = True
    return out


def covariance(advantages: Tensor, logprobs: Tensor) -> Tensor:
    """Per-token (A - mean A) (log pi - mean log pi) over the group's tokens: the covariance terms whose
    sum drives the entropy change of a policy-gradient step (Cui et al., Eq. 4)."""
    a = advantages.double()
    lp = logprobs.double()
    return (a - a.mean()) * (lp - lp.mean())


def combine_effects(effects: list[TokenEffect], advantages: Tensor) -> TokenEffect:
    """Compose methods applied in order to the same tokens: the last shaped advantages, the product of
    weights, the intersection of kept tokens, the sum of each named term, the union of selections.
    The trainer composes the methods of a run with this function (trainer/shaping.py)."""
    import torch

    out = TokenEffect(selected=torch.zeros(advantages.numel(), dtype=torch.bool, device=advantages.device))
    for e in effects:
        out.selected = out.selected | e.selected
        if e.advantages is not None:
            out.advantages = e.advantages
        if e.weights is not None:
            out.weights = e.weights if out.weights is None else out.weights * e.weights
        if e.keep is not None:
            out.keep = e.keep if out.keep is None else out.keep & e.keep
        for name, term in (e.terms or {}).items():
            out.terms = dict(out.terms or {})
            out.terms[name] = term if name not in out.terms else out.terms[name] + term
    return out


def has_state(method: Any) -> bool:
    """A registered method that keeps state: a class (built once per run), not a plain function."""
    return isinstance(method, type)


class RunMethods:
    """The token methods of one run, by name: a registered class is built once, with its settings,
    the first time the run uses it, and keeps its state across steps; a plain function is used as
    registered. The trainer holds one (`Run.methods`) and checkpoints its `state_dict`."""

    def __init__(self) -> None:
        self._instances: dict[str, StatefulMethod] = {}
        self._pending: dict[str, dict] = {}  # restored state of methods not built yet

    def get(self, name: str, settings: Any = None) -> Any:
        """The callable of method `name`: the run's instance of a stateful method (built from
        `settings` on first use), else the registered function."""
        method = TOKEN_METHODS.get(name)
        if not has_state(method):
            return method
        if name not in self._instances:
            instance = method(settings)
            if name in self._pending:
                instance.load_state_dict(self._pending.pop(name))
            self._instances[name] = instance
        return self._instances[name]

    def resolve(self, names: list[str], settings: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        """(name, callable, settings) of each method of `names`, in order."""
        return [(name, self.get(name, settings.get(name)), settings.get(name)) for name in names]

    def observe(self, names: list[str], settings: dict[str, Any], batch_entropy: float) -> None:
        """Once per step, before selection: every stateful method of `names` sees the batch entropy."""
        for _, method, _ in self.resolve(names, settings):
            if hasattr(method, "observe"):
                method.observe(batch_entropy)

    def state_dict(self) -> dict[str, dict]:
        """Every built method's state by name (and restored states not claimed yet)."""
        return {**self._pending, **{name: m.state_dict() for name, m in self._instances.items()}}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        for name, value in state.items():
            if name in self._instances:
                self._instances[name].load_state_dict(value)
            else:
                self._pending[name] = value
