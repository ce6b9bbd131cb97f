"""The entropy study's figure: entropy, its paired difference to GRPO-ds, held-out and train accuracy
per arm (mean and min-max over seeds); for the baselines study two panels more."""

from __future__ import annotations

from pathlib import Path

from harness import smooth


def plot(
    arms: dict,
    results: dict,
    docs: Path,
    smooth_k: int = 5,
    filename: str = "entropy.png",
    paired_heldout: bool = False,
) -> None:
    """Four panels: entropy, its paired difference to GRPO-ds, held-out accuracy and train accuracy.
    paired_heldout (the baselines study) adds two: the held-out accuracy minus GRPO-ds's of the same
    seed (methods with different seed sets are only comparable paired), and the entropy against the
    held-out accuracy (a method that only learns slower keeps its entropy longer without keeping
    more of it at equal accuracy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    if paired_heldout:
        fig, ((ax1, ax4), (ax2, ax3), (ax5, ax_train)) = plt.subplots(3, 2, figsize=(16, 15))
    else:
        fig, ((ax1, ax4), (ax2, ax_train)) = plt.subplots(2, 2, figsize=(16, 10))
    ref = {m["seed"]: m for m in results["grpo_ds"]["per_seed"]} if "grpo_ds" in results else {}
    targets = sorted({arms[n]["target"] for n in results})
    for t in targets:
        ax1.axhspan(t * 0.9, t * 1.1, color="grey", alpha=0.12)
        ax1.axhline(t, color="grey", lw=0.6, ls=":")
    for name, r in results.items():
        seeds = r["per_seed"]
        n = min(len(m["entropy"]) for m in seeds)
        if n == 0:
            continue
        # GRPO-ds is the reference every other arm is read against: draw it black and on top.
        style = {"color": "black", "lw": 2.0, "zorder": 5} if name == "grpo_ds" else {"lw": 1.2}
        label = arms[name]["label"]
        H = np.array([m["entropy"][:n] for m in seeds])
        x = np.array(seeds[0]["step"][:n])
        (line,) = ax1.plot(x, H.mean(0), label=label, **style)
        color = line.get_color()
        if len(seeds) > 1:
            ax1.fill_between(x, H.min(0), H.max(0), color=color, alpha=0.12)
        ev_steps = sorted({s for m in seeds for s, _ in m["eval"]})
        ev = np.array([[dict(m["eval"]).get(s, np.nan) for s in ev_steps] for m in seeds])
        if ev_steps:
            ax2.plot(ev_steps, np.nanmean(ev, 0), "o-", ms=4, label=label, **style)
            if len(seeds) > 1:
                ax2.fill_between(ev_steps, np.nanmin(ev, 0), np.nanmax(ev, 0), color=color, alpha=0.12)
        A = np.array([[np.nan if v is None else v for v in m["acc_train"][:n]] for m in seeds])
        ax_train.plot(x, smooth(np.nanmean(A, 0), smooth_k), label=label, **style)
        if paired_heldout:
            # entropy over the smooth_k steps up to each evaluation, against that evaluation's accuracy
            pts = [
                [
                    (acc, np.mean([h for st, h in zip(m["step"], m["entropy"]) if s - smooth_k < st <= s]))
                    for s, acc in m["eval"]
                    if s > 0
                ]
                for m in seeds
            ]
            k = min(len(p) for p in pts)
            if k:
                P = np.array([p[:k] for p in pts])  # [seeds, evals, (acc, H)]
                ax5.plot(P[:, :, 0].mean(0), P[:, :, 1].mean(0), "o-", ms=4, label=label, **style)
            both = [m for m in seeds if m["seed"] in ref]
            if both and name != "grpo_ds" and ev_steps:
                ref_ev = [dict(ref[m["seed"]]["eval"]) for m in both]
                D = np.array(
                    [
                        [dict(m["eval"]).get(s, np.nan) - r.get(s, np.nan) for s in ev_steps]
                        for m, r in zip(both, ref_ev)
                    ]
                )
                ax3.plot(ev_steps, np.nanmean(D, 0), "o-", ms=4, label=label, **style)
                if len(both) > 1:
                    ax3.fill_between(ev_steps, np.nanmin(D, 0), np.nanmax(D, 0), color=color, alpha=0.12)
        paired = [m for m in seeds if m["seed"] in ref and len(ref[m["seed"]]["entropy"]) >= n]
        if paired and name != "grpo_ds":
            D = np.array([np.array(m["entropy"][:n]) - np.array(ref[m["seed"]]["entropy"][:n]) for m in paired])
            ax4.plot(x, smooth(D.mean(0), smooth_k), label=label, **style)
            if len(paired) > 1:
                ax4.fill_between(x, smooth(D.min(0), smooth_k), smooth(D.max(0), smooth_k), color=color, alpha=0.12)
    ax1.set(
        xlabel="RL step",
        ylabel="batch entropy (nats/token)",
        yscale="log",
        title="Policy entropy (mean, min-max over seeds; grey: H* ±10%)",
    )
    ax2.set(xlabel="RL step", ylabel="held-out accuracy", title="Held-out accuracy (mean, min-max over seeds)")
    ax_train.set(
        xlabel="RL step",
        ylabel="train accuracy",
        title=f"Train accuracy (mean over seeds, trailing {smooth_k}-step mean)",
    )
    axes = [ax1, ax2, ax4, ax_train]
    if paired_heldout:
        ax3.axhline(0.0, color="black", lw=1.0)
        ax3.set(
            xlabel="RL step",
            ylabel="acc(arm) - acc(GRPO-ds), same seed",
            title="Held-out accuracy difference to GRPO-ds, paired by seed (mean, min-max)",
        )
        ax5.set(
            xlabel="held-out accuracy",
            ylabel=f"batch entropy, mean of the {smooth_k} steps up to the evaluation",
            yscale="log",
            title="Entropy against held-out accuracy (mean over seeds, one point per evaluation after step 0)",
        )
        axes += [ax3, ax5]
    ax4.axhline(0.0, color="black", lw=1.0)
    ax4.set(
        xlabel="RL step",
        ylabel="H(arm) - H(GRPO-ds), same seed",
        title=f"Entropy difference to GRPO-ds, paired by seed (trailing {smooth_k}-step mean, min-max)",
    )
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(docs / filename, dpi=110)
    plt.close(fig)
