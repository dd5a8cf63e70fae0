"""Prospect theory as used by Humanline (Liu, Muennighoff, Ethayarajh; arXiv 2509.24207, section 3).

Prospect theory (Kahneman & Tversky 1979; Tversky & Kahneman 1992) describes how people value a
gamble Z that pays outcome z_i with probability p_i. Two things differ from expected value:

* outcomes are judged relative to a reference point z0 through a value function v (Def. 3.1),
  concave for gains and steeper for losses (risk and loss aversion);
* probabilities are distorted by a capacity function Omega (Def. 3.2, eq. 3) with an inverted-S
  shape: rare extreme outcomes are overweighted and typical ones underweighted. The distortion
  is applied to *decumulative* probabilities ("how likely is an outcome at least this good"),
  and the decision weight of an outcome is the difference of two distorted probabilities
  (eq. 4), so the weights of the gains add up to Omega+(P[gain]).

The subjective expected utility (Def. 3.3) is u = sum_i w_i v(z_i). Proposition 3.4 bounds how
far it can be from the objective expectation under Q by ||v||_inf * sqrt(2 KL(omega || Q))
(Pinsker's inequality): a perceptual distortion with small KL barely changes the utility.

Run ``python prospect.py`` for a table of the weighting function (and a plot if matplotlib is
installed). Parameters default to the median estimates of Tversky & Kahneman (1992).
"""

import argparse

import numpy as np
from scipy.special import rel_entr

ALPHA = 0.88  # curvature of the value function
LAMBDA = 2.25  # loss aversion
GAMMA_GAIN = 0.61  # probability distortion for gains
GAMMA_LOSS = 0.69  # probability distortion for losses


def _as_output(x: np.ndarray):
    """A 0-d array becomes a numpy float, anything else stays an array."""
    return x[()] if x.ndim == 0 else x


def value(z, alpha: float = ALPHA, lam: float = LAMBDA, z0: float = 0.0):
    """Def. 3.1: (z - z0)^alpha for gains (z >= z0), -lam * (z0 - z)^alpha for losses."""
    d = np.asarray(z, dtype=float) - z0
    magnitude = np.abs(d) ** alpha
    return _as_output(np.where(d >= 0, magnitude, -lam * magnitude))


def capacity(a, gamma: float):
    """Eq. 3: Omega(a; gamma) = a^gamma / (a^gamma + (1 - a)^gamma)^(1/gamma), for a in [0, 1].

    gamma = 1 is the identity (objective probabilities); gamma < 1 gives the inverted S.
    Omega(0) = 0 and Omega(1) = 1 exactly.
    """
    if not gamma > 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    a = np.asarray(a, dtype=float)
    if np.any((a < 0) | (a > 1)):
        raise ValueError("capacity is defined for probabilities in [0, 1]")
    num = a**gamma
    return _as_output(num / (num + (1 - a) ** gamma) ** (1 / gamma))


def _check_prospect(outcomes, probs) -> tuple[np.ndarray, np.ndarray]:
    outcomes = np.asarray(outcomes, dtype=float)
    probs = np.asarray(probs, dtype=float)
    if outcomes.ndim != 1 or outcomes.shape != probs.shape or outcomes.size == 0:
        raise ValueError(
            f"outcomes and probs must be non-empty 1-d arrays of the same length, "
            f"got shapes {outcomes.shape} and {probs.shape}"
        )
    if np.any(probs < 0):
        raise ValueError("probs must be non-negative")
    if abs(probs.sum() - 1) > 1e-6:
        raise ValueError(f"probs must sum to 1 (within 1e-6), got {probs.sum()}")
    return outcomes, probs / probs.sum()


def weights(
    outcomes, probs, gamma_gain: float = GAMMA_GAIN, gamma_loss: float = GAMMA_LOSS, z0: float = 0.0
) -> np.ndarray:
    """Eq. 4: the decision weight of each outcome, in the order given.

    Gain z (z >= z0):  Omega+(P[Z >= z]) - Omega+(P[Z > z])   (decumulative, from the best gain)
    Loss z (z <  z0):  Omega-(P[Z <= z]) - Omega-(P[Z < z])   (cumulative, from the worst loss)

    Equal outcomes are one outcome: their merged probability gets one weight, which is then
    shared among the duplicates in proportion to their probabilities.
    """
    outcomes, probs = _check_prospect(outcomes, probs)
    unique, index = np.unique(outcomes, return_inverse=True)  # unique is sorted ascending
    p = np.bincount(index, weights=probs, minlength=unique.size)

    # P[Z <= u_j] and P[Z < u_j]; P[Z >= u_j] = 1 - P[Z < u_j] and P[Z > u_j] = 1 - P[Z <= u_j].
    # Clipping guards against round-off pushing a sum a hair outside [0, 1].
    at_most = np.clip(np.cumsum(p), 0, 1)
    below = np.concatenate([[0.0], at_most[:-1]])
    at_least = np.clip(np.cumsum(p[::-1])[::-1], 0, 1)
    above = np.concatenate([at_least[1:], [0.0]])

    gain = unique >= z0
    w = np.where(
        gain,
        capacity(at_least, gamma_gain) - capacity(above, gamma_gain),
        capacity(at_most, gamma_loss) - capacity(below, gamma_loss),
    )

    # Split each merged weight back among its duplicates (an outcome of probability 0 gets 0).
    share = np.divide(probs, p[index], out=np.zeros_like(probs), where=p[index] > 0)
    return w[index] * share


def subjective_utility(
    outcomes,
    probs,
    alpha: float = ALPHA,
    lam: float = LAMBDA,
    gamma_gain: float = GAMMA_GAIN,
    gamma_loss: float = GAMMA_LOSS,
    z0: float = 0.0,
) -> float:
    """Def. 3.3: u = sum_i w_i v(z_i), with the weights of eq. 4 and the value of Def. 3.1."""
    w = weights(outcomes, probs, gamma_gain, gamma_loss, z0)
    return float(np.sum(w * value(outcomes, alpha, lam, z0)))


def utility_gap_bound(omega, q, v_sup: float) -> float:
    """Prop. 3.4: v_sup * sqrt(2 KL(omega || q)) bounds |sum omega v - sum q v| when |v| <= v_sup.

    omega and q are discrete distributions over the same outcomes. KL uses 0 log 0 = 0 and is
    infinite when omega puts mass where q has none.
    """
    omega = np.asarray(omega, dtype=float)
    q = np.asarray(q, dtype=float)
    if omega.ndim != 1 or omega.shape != q.shape:
        raise ValueError(f"omega and q must be 1-d of the same length, got {omega.shape} and {q.shape}")
    for name, dist in (("omega", omega), ("q", q)):
        if np.any(dist < 0) or abs(dist.sum() - 1) > 1e-6:
            raise ValueError(f"{name} must be non-negative and sum to 1 (within 1e-6)")
    if v_sup < 0:
        raise ValueError(f"v_sup must be >= 0, got {v_sup}")
    kl = float(np.sum(rel_entr(omega, q)))
    if np.isinf(kl):
        return float("inf")
    return v_sup * float(np.sqrt(2 * max(kl, 0.0)))  # max: KL can round to -1e-17


def main() -> None:
    parser = argparse.ArgumentParser(description="Tabulate (and plot) the Tversky-Kahneman weighting.")
    parser.add_argument("--out", default="prospect_weighting.png", help="where to write the plot")
    args = parser.parse_args()

    ps = [0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0]
    print(f"{'p':>6} {'gains (0.61)':>14} {'losses (0.69)':>14}")
    for p in ps:
        print(f"{p:>6.2f} {capacity(p, GAMMA_GAIN):>14.4f} {capacity(p, GAMMA_LOSS):>14.4f}")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the plot")
        return
    grid = np.linspace(0, 1, 201)
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot(grid, grid, "k:", label="objective")
    ax.plot(grid, capacity(grid, GAMMA_GAIN), label=f"gains, gamma = {GAMMA_GAIN}")
    ax.plot(grid, capacity(grid, GAMMA_LOSS), label=f"losses, gamma = {GAMMA_LOSS}")
    ax.set_xlabel("probability p")
    ax.set_ylabel("capacity Omega(p)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=150)
    print(f"plot written to {args.out}")


if __name__ == "__main__":
    main()
