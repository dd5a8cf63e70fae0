"""Unit tests of humanline_sampling.py: rejection rates, the clipping limit, gradients, RNG."""

import math

import pytest
import torch

from humanline_sampling import _log_beta, apply_humanline_sampling, limit_parameters, rejection_mask

torch.set_num_threads(1)
N = 200_000
LOG_EPS_P, LOG_EPS_R = -1.5, 1.5


def constant_ratio(log_rho: float, n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    """(policy_logps, ref_logps) whose token log ratios all equal log_rho."""
    ref = torch.full((n,), -2.0)
    return ref + log_rho, ref


def assert_rate(observed: float, expected: float, n: int = N) -> None:
    se = math.sqrt(expected * (1 - expected) / n)
    assert abs(observed - expected) <= 4 * se, (observed, expected, se)


@pytest.mark.parametrize(
    "gamma, rho, M", [(0.3, 0.05, 1.0), (0.61, 0.5, 2.0), (1.0, 0.3, 1.0), (2.0, 1.5, 2.0), (0.01, 1e-3, 1.0)]
)
def test_policy_side_acceptance_is_power_of_ratio(gamma, rho, M):
    # Prop. 4.1: with B ~ Beta(gamma, 1) a token is kept with probability (rho / M)^gamma.
    policy, ref = constant_ratio(math.log(rho))
    gen = torch.Generator().manual_seed(0)
    mask = rejection_mask(policy, ref, gamma, 1.0, 1.0, 1.0, math.log(M), -math.inf, gen)
    assert_rate(1 - mask.double().mean().item(), (rho / M) ** gamma)


@pytest.mark.parametrize("gamma, rho, M", [(0.69, 4.0, 1.0), (1.5, 2.5, 0.5)])
def test_reference_side_acceptance_is_power_of_inverse_ratio(gamma, rho, M):
    policy, ref = constant_ratio(math.log(rho))
    gen = torch.Generator().manual_seed(1)
    mask = rejection_mask(policy, ref, 1.0, 1.0, gamma, 1.0, -math.inf, math.log(M), gen)
    assert_rate(1 - mask.double().mean().item(), (1 / (rho * M)) ** gamma)


def test_ratio_above_bound_is_never_rejected():
    policy, ref = constant_ratio(math.log(3.0))
    mask = rejection_mask(policy, ref, 0.61, 1.0, 1.0, 1.0, math.log(2.0), -math.inf)
    assert not mask.any()


@pytest.mark.parametrize("M_P, M_R", [(1.0, 1.0), (2.0, 3.0)])
def test_large_c_limit_is_clipping(M_P, M_R):
    # Theorem 4.3: c -> inf rejects exactly the tokens with ratio outside [eps_P, eps_R].
    gen = torch.Generator().manual_seed(2)
    log_ratio = torch.rand(N, generator=gen) * 6 - 3
    params = limit_parameters(math.exp(LOG_EPS_P), math.exp(LOG_EPS_R), M_P, M_R, c=1e6)
    mask = rejection_mask(log_ratio, torch.zeros(N), *params, math.log(M_P), math.log(M_R), gen)
    clipped = (log_ratio < LOG_EPS_P) | (log_ratio > LOG_EPS_R)
    assert (mask == clipped).double().mean().item() >= 0.999


def test_small_c_is_a_noisy_clamp():
    gen = torch.Generator().manual_seed(3)
    log_ratio = torch.rand(N, generator=gen) * 6 - 3
    params = limit_parameters(math.exp(LOG_EPS_P), math.exp(LOG_EPS_R), c=10.0)
    mask = rejection_mask(log_ratio, torch.zeros(N), *params, generator=gen)
    clipped = (log_ratio < LOG_EPS_P) | (log_ratio > LOG_EPS_R)
    agreement = (mask == clipped).double().mean().item()
    assert 0.7 < agreement < 0.95
    # Far from the thresholds the decision is (almost) the clamp's.
    assert mask[log_ratio.abs() < 0.2].double().mean().item() < 1e-3
    assert mask[log_ratio.abs() > 2.8].double().mean().item() > 0.9


@pytest.mark.parametrize("a, b", [(0.3, 1.0), (0.01, 5.0), (3.0, 0.5), (2.2e5, 7.8e5)])
def test_log_beta_moments(a, b):
    # E[log B] = digamma(a) - digamma(a + b), Var[log B] = trigamma(a) - trigamma(a + b).
    gen = torch.Generator().manual_seed(4)
    x = _log_beta(a, b, torch.Size([N]), gen, torch.device("cpu"))
    a_, ab = torch.tensor(a, dtype=torch.float64), torch.tensor(a + b, dtype=torch.float64)
    mean = (torch.digamma(a_) - torch.digamma(ab)).item()
    var = (torch.polygamma(1, a_) - torch.polygamma(1, ab)).item()
    assert torch.isfinite(x).all()
    assert abs(x.mean().item() - mean) <= 5 * math.sqrt(var / N)
    assert x.var().item() == pytest.approx(var, rel=0.05)


def test_beta_zero_is_point_mass_at_one():
    x = _log_beta(0.61, 0.0, torch.Size([3, 4]), None, torch.device("cpu"))
    assert torch.equal(x, torch.zeros(3, 4, dtype=torch.float64))


def test_rejected_tokens_pass_no_gradient():
    gen = torch.Generator().manual_seed(5)
    policy = (torch.randn(4, 16, generator=gen) * 2).requires_grad_()
    ref = torch.zeros(4, 16)
    logps, rejected = apply_humanline_sampling(
        policy, ref, *limit_parameters(math.exp(LOG_EPS_P), math.exp(LOG_EPS_R)), generator=gen
    )
    assert rejected.any() and (~rejected).any()
    assert torch.equal(logps, policy)
    logps.sum().backward()
    assert torch.equal(policy.grad, (~rejected).float())


def test_generator_makes_draws_reproducible():
    log_ratio = torch.linspace(-3, 3, 10_000)
    params = limit_parameters(math.exp(LOG_EPS_P), math.exp(LOG_EPS_R), c=20.0)

    def draw(seed):
        return rejection_mask(
            log_ratio, torch.zeros_like(log_ratio), *params, generator=torch.Generator().manual_seed(seed)
        )

    global_state = torch.get_rng_state()
    assert torch.equal(draw(0), draw(0))
    assert not torch.equal(draw(0), draw(1))
    assert torch.equal(torch.get_rng_state(), global_state)  # the global RNG is left alone


@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_shapes_and_dtypes(shape, dtype):
    policy = torch.randn(shape).to(dtype)
    ref = torch.randn(shape).to(dtype)
    logps, rejected = apply_humanline_sampling(policy, ref, 2.0, 3.0, 2.0, 3.0)
    assert logps.shape == shape and logps.dtype == dtype
    assert rejected.shape == shape and rejected.dtype == torch.bool
    assert torch.equal(logps, policy)


def test_mismatched_shapes_and_bad_beta_parameters_raise():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        rejection_mask(x, torch.zeros(4), 1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="side P"):
        rejection_mask(x, x, 0.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="side R"):
        rejection_mask(x, x, 1.0, 1.0, 1.0, -1.0)


def test_limit_parameters_by_hand():
    gamma_P, beta_P, gamma_R, beta_R = limit_parameters(0.5, 2.0, M_P=2.0, M_R=1.0, c=10.0)
    assert (gamma_P, beta_P, gamma_R, beta_R) == pytest.approx((2.5, 7.5, 5.0, 5.0))
    # The thresholds' means are eps_P and 1 / eps_R.
    gamma_P, beta_P, gamma_R, beta_R = limit_parameters(0.8, 1.2, M_P=1.5, M_R=2.0, c=7.0)
    assert 1.5 * gamma_P / (gamma_P + beta_P) == pytest.approx(0.8)
    assert 2.0 * gamma_R / (gamma_R + beta_R) == pytest.approx(1 / 1.2)
    # Boundary cases are allowed and give a point mass at 1.
    assert limit_parameters(1.0, 1.0, 1.0, 1.0, c=5.0) == pytest.approx((5.0, 0.0, 5.0, 0.0))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(eps_P=0.0, eps_R=2.0), "0 < eps_P <= M_P"),
        (dict(eps_P=1.5, eps_R=2.0, M_P=1.0), "0 < eps_P <= M_P"),
        (dict(eps_P=0.5, eps_R=1.5, M_R=0.5), "eps_R \\* M_R >= 1"),
        (dict(eps_P=0.5, eps_R=2.0, c=0.0), "c > 0"),
    ],
)
def test_limit_parameters_rejects_invalid_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        limit_parameters(**kwargs)
