"""Unit tests of prospect.py against hand computations and published values."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from paths import ROOT

import prospect
from prospect import capacity, subjective_utility, utility_gap_bound, value, weights


def tk(p: float, g: float) -> float:
    """Eq. 3 written out again, independently of prospect.capacity."""
    return p**g / (p**g + (1 - p) ** g) ** (1 / g)


# --- capacity -------------------------------------------------------------------------------


def test_gamma_one_is_objective():
    grid = np.linspace(0, 1, 101)
    np.testing.assert_allclose(capacity(grid, 1.0), grid, atol=1e-15)
    outcomes = [-3.0, -1.0, 0.0, 2.0, 5.0]
    probs = [0.1, 0.25, 0.15, 0.3, 0.2]
    np.testing.assert_allclose(weights(outcomes, probs, 1.0, 1.0), probs, atol=1e-15)


@pytest.mark.parametrize("gamma", [0.3, 0.61, 0.69, 1.0, 2.0])
def test_capacity_endpoints_are_exact(gamma):
    assert capacity(0.0, gamma) == 0.0
    assert capacity(1.0, gamma) == 1.0


def test_capacity_matches_tversky_kahneman():
    # Tversky & Kahneman (1992): w+(0.5) is about 0.42 for gamma = 0.61.
    assert capacity(0.5, 0.61) == pytest.approx(0.42, abs=0.005)
    # Inverted S: rare outcomes overweighted, near-certain ones underweighted.
    assert capacity(0.01, 0.61) > 0.05
    assert capacity(0.99, 0.61) < 0.92
    grid = np.array([0.01, 0.3, 0.7, 0.99])
    np.testing.assert_allclose(capacity(grid, 0.69), [tk(p, 0.69) for p in grid], rtol=1e-13)


# --- weights --------------------------------------------------------------------------------


def test_spec_worked_example(monkeypatch):
    # Gains +50 (p 0.6), +100 (p 0.2), and 0 (p 0.2). The decumulative probabilities are
    # P[Z >= 50] = 0.8 and P[Z >= 100] = 0.2; if they are perceived as 0.8 and 0.3 the weights
    # are 0.8 - 0.3 = 0.5 and 0.3 - 0 = 0.3 (and the 0 outcome gets 1 - 0.8).
    perceived = {0.0: 0.0, 0.2: 0.3, 0.8: 0.8, 1.0: 1.0}

    def fake_capacity(a, gamma):
        return np.vectorize(lambda x: perceived[round(float(x), 9)])(a)

    monkeypatch.setattr(prospect, "capacity", fake_capacity)
    np.testing.assert_allclose(prospect.weights([0, 50, 100], [0.2, 0.6, 0.2]), [0.2, 0.5, 0.3])


def test_weights_by_hand_with_real_gamma():
    g = 0.61
    w = weights([50, 0, 100], [0.6, 0.2, 0.2])  # deliberately unsorted
    np.testing.assert_allclose(w, [tk(0.8, g) - tk(0.2, g), 1 - tk(0.8, g), tk(0.2, g)], rtol=1e-12)

    # Reference point 60: 0 and 50 become losses, weighted cumulatively from the worst one.
    gl = 0.69
    w = weights([50, 0, 100], [0.6, 0.2, 0.2], z0=60)
    np.testing.assert_allclose(w, [tk(0.8, gl) - tk(0.2, gl), tk(0.2, gl), tk(0.2, g)], rtol=1e-12)


def test_gain_weights_sum_to_capacity_of_gain_probability():
    rng = np.random.default_rng(0)
    outcomes = rng.uniform(0.1, 10, size=7)
    probs = rng.dirichlet(np.ones(7))
    assert weights(outcomes, probs).sum() == pytest.approx(1.0, abs=1e-12)
    # Mixed prospect: the gains telescope to Omega+(P[gain]), the losses to Omega-(P[loss]).
    outcomes = np.array([-4.0, -1.0, 2.0, 3.0, 8.0])
    probs = np.array([0.1, 0.2, 0.3, 0.25, 0.15])
    w = weights(outcomes, probs)
    assert w[outcomes >= 0].sum() == pytest.approx(tk(0.7, 0.61), rel=1e-12)
    assert w[outcomes < 0].sum() == pytest.approx(tk(0.3, 0.69), rel=1e-12)


def test_equal_outcomes_are_not_double_counted():
    merged = weights([10, 30], [0.5, 0.5])
    w = weights([10, 30, 10], [0.3, 0.5, 0.2])
    assert w[0] + w[2] == pytest.approx(merged[0], rel=1e-12)
    assert w[0] / w[2] == pytest.approx(0.3 / 0.2, rel=1e-12)
    assert w[1] == pytest.approx(merged[1], rel=1e-12)
    # A duplicate with probability 0 gets no weight.
    np.testing.assert_allclose(weights([10, 10, 30], [0.5, 0.0, 0.5]), [merged[0], 0.0, merged[1]])


def test_weights_do_not_depend_on_input_order():
    rng = np.random.default_rng(1)
    outcomes = np.array([-2.0, 5.0, 5.0, -7.0, 1.0, 0.0])
    probs = rng.dirichlet(np.ones(6))
    perm = rng.permutation(6)
    np.testing.assert_allclose(weights(outcomes[perm], probs[perm]), weights(outcomes, probs)[perm], rtol=1e-12)


def test_losses_mirror_gains():
    g = 0.69
    w = weights([-100, -50, -10], [0.2, 0.6, 0.2])
    np.testing.assert_allclose(w, [tk(0.2, g), tk(0.8, g) - tk(0.2, g), 1 - tk(0.8, g)], rtol=1e-12)
    rng = np.random.default_rng(2)
    x = rng.uniform(0.5, 9, size=6)
    p = rng.dirichlet(np.ones(6))
    np.testing.assert_allclose(
        weights(-x, p, gamma_gain=0.4, gamma_loss=0.69), weights(x, p, gamma_gain=0.69, gamma_loss=0.4), rtol=1e-12
    )


# --- value and utility ----------------------------------------------------------------------


def test_value_by_hand():
    assert value(1.0) == pytest.approx(1.0)
    assert value(-1.0) == pytest.approx(-2.25)
    assert value(0.0) == 0.0
    assert value(4.0, alpha=0.5) == pytest.approx(2.0)
    assert value(-4.0, alpha=0.5, lam=3.0) == pytest.approx(-6.0)
    assert value(3.0, z0=2.0) == pytest.approx(1.0)
    assert value(1.0, z0=2.0) == pytest.approx(-2.25)
    np.testing.assert_allclose(value([10.0, -10.0]), [10**0.88, -2.25 * 10**0.88])


def test_subjective_utility_by_hand():
    # 0 counts as a gain: P[Z >= 0] = 0.7, P[Z > 0] = 0.4; its value is 0 anyway.
    expected = tk(0.3, 0.69) * (-2.25 * 10**0.88) + tk(0.4, 0.61) * 20**0.88
    assert subjective_utility([-10, 0, 20], [0.3, 0.3, 0.4]) == pytest.approx(expected, rel=1e-12)
    # Objective limit: alpha = lam = gamma = 1 is the expected value.
    assert subjective_utility([-10, 0, 20], [0.3, 0.3, 0.4], 1, 1, 1, 1) == pytest.approx(5.0)


# --- Proposition 3.4 ------------------------------------------------------------------------


def test_utility_gap_bound_by_hand():
    kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert utility_gap_bound([0.5, 0.5], [0.25, 0.75], 3.0) == pytest.approx(3 * math.sqrt(2 * kl))
    expected = 2 * math.sqrt(2 * math.log(2))  # 0 log 0 = 0
    assert utility_gap_bound([1.0, 0.0], [0.5, 0.5], 2.0) == pytest.approx(expected)
    assert utility_gap_bound([0.5, 0.5], [1.0, 0.0], 1.0) == math.inf
    assert utility_gap_bound([0.2, 0.8], [0.2, 0.8], 5.0) == 0.0


def test_proposition_3_4_holds_on_random_distributions():
    rng = np.random.default_rng(3)
    ratios = []
    for _ in range(2000):
        n = rng.integers(2, 8)
        omega = rng.dirichlet(np.full(n, rng.uniform(0.1, 3)))
        if rng.random() < 0.3:  # exercise the 0 log 0 convention
            omega[rng.integers(n)] = 0.0
            omega /= omega.sum()
        q = rng.dirichlet(np.full(n, rng.uniform(0.1, 3)))
        v_sup = rng.uniform(0.1, 10)
        v = rng.uniform(-v_sup, v_sup, size=n)
        gap = abs(omega @ v - q @ v)
        bound = utility_gap_bound(omega, q, v_sup)
        assert gap <= bound + 1e-12
        ratios.append(gap / bound)
    assert max(ratios) > 0.5  # the bound is not vacuous on these draws


# --- validation and the script --------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: weights([1, 2], [1.0]),
        lambda: weights([], []),
        lambda: weights([1, 2], [1.2, -0.2]),
        lambda: weights([1, 2], [0.5, 0.4]),
        lambda: capacity(1.2, 0.61),
        lambda: capacity(0.5, 0.0),
        lambda: utility_gap_bound([0.5, 0.5], [1.0], 1.0),
        lambda: utility_gap_bound([0.5, 0.6], [0.5, 0.5], 1.0),
        lambda: utility_gap_bound([0.5, 0.5], [0.5, 0.5], -1.0),
    ],
)
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()


def test_script_prints_table(tmp_path):
    out = tmp_path / "weighting.png"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "prospect.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [float(r[0]) for r in rows] == [0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1]
    for p, gain, loss in ((float(r[0]), float(r[1]), float(r[2])) for r in rows):
        assert gain == pytest.approx(tk(p, 0.61), abs=5e-5)
        assert loss == pytest.approx(tk(p, 0.69), abs=5e-5)
    if "plot written to" in proc.stdout:
        assert out.is_file()
    else:
        assert "matplotlib is not installed" in proc.stdout
