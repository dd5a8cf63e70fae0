"""Humanline sampling: token-wise Beta rejection (arXiv 2509.24207, section 4).

Definition 4.2. With rho_t = pi_theta(y_t | ..) / pi_ref(y_t | ..), token t is *rejected* if

    rho_t < M_P * B_P    or    1 / rho_t < M_R * B_R,
    B_P ~ Beta(gamma_P, beta_P),  B_R ~ Beta(gamma_R, beta_R),  independent, fresh per token.

A rejected token stays in the sequence with its value but passes no gradient. This is the
token-level version of Proposition 4.1: with B ~ Beta(gamma, 1) a token is kept with probability
(rho / M)^gamma, which draws outputs from a prospect-theoretic distortion of the reference.

Theorem 4.3. With gamma_P = c eps_P / M_P, beta_P = c (1 - eps_P / M_P), gamma_R = c / (eps_R M_R),
beta_R = c (1 - 1 / (eps_R M_R)), the thresholds M_P B_P and M_R B_R have means eps_P and
1 / eps_R, and their noise vanishes as c -> infinity: the kept tokens are exactly those with
eps_P <= rho <= eps_R, i.e. humanline clipping (and PPO's clip for eps_P, eps_R = 1 -/+ eps).

Choice of M_P and M_R. The theorem only needs eps_P <= M_P and eps_R M_R >= 1. At finite c the
thresholds have variances eps_P (M_P - eps_P) / (c + 1) and (1 / eps_R)(M_R - 1 / eps_R) / (c + 1):
M scales the noise along with c. We fix M_P = M_R = 1 (log M = 0): the smallest single value
that is valid for every clip range containing ratio 1 (the paper's -1.5 / +1.5 in log space,
PPO's 1 -/+ eps), and a constant rather than a running maximum of the ratios, so the rule stays
per-token and independent of the batch and of the number of processes. The paper does not pin M
down; this is our choice.

Choice of c. DEFAULT_C = 100 makes sampling a noisy clamp: with the default log eps of -1.5 / +1.5
the log-thresholds have a standard deviation of about 0.19 nats around -1.5 / +1.5. Larger c
approaches clipping (c = 1e6: about 0.002 nats).

Usage in a training loop, in place of the humanline clamp (the paper's ablation, Figure 5):

    params = limit_parameters(math.exp(log_eps_P), math.exp(log_eps_R))  # M = 1, c = DEFAULT_C
    logps, rejected = apply_humanline_sampling(policy_logps, ref_logps, *params, generator=gen)
    log_ratio = logps - ref_logps  # feeds the loss; rejected tokens carry no gradient

A side can be switched off by passing log_M = -inf for it (it then never rejects and draws
nothing), which gives the single-sided rejection of Proposition 4.1.

Beta draws. torch.distributions.Beta cannot take a torch.Generator, so we draw
B = G_a / (G_a + G_b) from two Gamma variates made with torch.randn / torch.rand and the given
generator: Marsaglia & Tsang (2000) for shape >= 1, and the boost G_a = G_{a+1} U^(1/a) for shape
< 1. Everything is done in float64 and in log space, so log B stays finite and exact even when B
itself would underflow (small gamma), and huge shapes (c = 1e6) are no problem.
"""

import math

import torch

DEFAULT_C = 100.0


def _log_gamma(shape: float, n: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """log of n independent Gamma(shape, 1) variates, float64 (shape 0 gives log 0 = -inf)."""
    kw = dict(generator=generator, dtype=torch.float64, device=device)
    if shape == 0:
        return torch.full((n,), -math.inf, dtype=torch.float64, device=device)
    a = shape + 1 if shape < 1 else shape  # boost small shapes, corrected below
    d = a - 1 / 3
    k = 1 / math.sqrt(9 * d)
    log_g = torch.empty(n, dtype=torch.float64, device=device)
    pending = torch.arange(n, device=device)
    while pending.numel() > 0:  # acceptance is >= 95% per round, so a handful of rounds
        x = torch.randn(pending.numel(), **kw)
        u = torch.rand(pending.numel(), **kw)
        v = (1 + k * x) ** 3
        log_v = torch.log(v.clamp_min(1e-300))
        ok = (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * log_v)
        log_g[pending[ok]] = math.log(d) + log_v[ok]
        pending = pending[~ok]
    if shape < 1:
        log_g += torch.log(torch.rand(n, **kw)) / shape
    return log_g


def _log_beta(
    a: float, b: float, shape: torch.Size, generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """log B for B ~ Beta(a, b), float64, one independent draw per element of `shape`.

    b = 0 is the point mass at 1 (Theorem 4.3 with eps_P = M_P or eps_R M_R = 1).
    """
    if b == 0:
        return torch.zeros(shape, dtype=torch.float64, device=device)
    n = math.prod(shape)
    log_ga = _log_gamma(a, n, generator, device)
    log_gb = _log_gamma(b, n, generator, device)
    return (log_ga - torch.logaddexp(log_ga, log_gb)).reshape(shape)


def _check_beta(name: str, gamma: float, beta: float) -> None:
    if not (gamma > 0 and beta >= 0 and math.isfinite(gamma) and math.isfinite(beta)):
        raise ValueError(f"Beta parameters of side {name} need gamma > 0 and beta >= 0, got gamma={gamma}, beta={beta}")


def rejection_mask(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    gamma_P: float,
    beta_P: float,
    gamma_R: float,
    beta_R: float,
    log_M_P: float = 0.0,
    log_M_R: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Def. 4.2: a bool tensor, True where the token is rejected.

    policy_logps, ref_logps: per-token log-probs of the same (any) shape, e.g. (batch, seq).
    Rejected iff log_ratio < log_M_P + log B_P or -log_ratio < log_M_R + log B_R, with fresh
    independent B_P ~ Beta(gamma_P, beta_P), B_R ~ Beta(gamma_R, beta_R) per token, drawn on the
    inputs' device from `generator` (the global RNG if None). log_M = -inf disables a side.
    Padding is not special: mask it out downstream as usual.
    """
    if policy_logps.shape != ref_logps.shape:
        raise ValueError(f"shape mismatch: policy {tuple(policy_logps.shape)}, reference {tuple(ref_logps.shape)}")
    _check_beta("P", gamma_P, beta_P)
    _check_beta("R", gamma_R, beta_R)
    log_ratio = (policy_logps.detach() - ref_logps.detach()).double()
    rejected = torch.zeros(log_ratio.shape, dtype=torch.bool, device=log_ratio.device)
    # B = 0 (log B = -inf, e.g. an underflow for tiny gamma) never rejects: rho < 0 is impossible.
    if log_M_P != -math.inf:
        log_b = _log_beta(gamma_P, beta_P, log_ratio.shape, generator, log_ratio.device)
        rejected |= log_ratio < log_M_P + log_b
    if log_M_R != -math.inf:
        log_b = _log_beta(gamma_R, beta_R, log_ratio.shape, generator, log_ratio.device)
        rejected |= -log_ratio < log_M_R + log_b
    return rejected


def limit_parameters(
    eps_P: float, eps_R: float, M_P: float = 1.0, M_R: float = 1.0, c: float = DEFAULT_C
) -> tuple[float, float, float, float]:
    """Theorem 4.3: (gamma_P, beta_P, gamma_R, beta_R) whose c -> inf limit clips to [eps_P, eps_R].

    eps_P, eps_R bound the ratio pi_theta / pi_ref (not its log). See the module docstring for
    the defaults M_P = M_R = 1 and c = DEFAULT_C.
    """
    if not 0 < eps_P <= M_P:
        raise ValueError(f"need 0 < eps_P <= M_P, got eps_P={eps_P}, M_P={M_P}")
    if not eps_R * M_R >= 1:
        raise ValueError(f"need eps_R * M_R >= 1, got eps_R={eps_R}, M_R={M_R}")
    if not c > 0:
        raise ValueError(f"need c > 0, got c={c}")
    p = eps_P / M_P  # mean of B_P
    r = 1 / (eps_R * M_R)  # mean of B_R
    return c * p, c * (1 - p), c * r, c * (1 - r)


def apply_humanline_sampling(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    gamma_P: float,
    beta_P: float,
    gamma_R: float,
    beta_R: float,
    log_M_P: float = 0.0,
    log_M_R: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Detach the tokens rejected by Def. 4.2. Returns (logps, rejected).

    logps has the values of policy_logps, but rejected tokens pass no gradient; rejected is the
    bool mask of `rejection_mask` (same arguments).
    """
    rejected = rejection_mask(policy_logps, ref_logps, gamma_P, beta_P, gamma_R, beta_R, log_M_P, log_M_R, generator)
    return torch.where(rejected, policy_logps.detach(), policy_logps), rejected
