"""Table-driven tests of decide(): one throttling response, one decision."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_retryafter.backoff import STRATEGIES
from scrapy_retryafter.policy import IDEMPOTENT_METHODS, Decision, SlotPolicy, decide, spider_handles

DEFAULT = SlotPolicy()


class UpperRng:
    """A random source whose uniform(a, b) always answers b."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.calls.append((a, b))
        return b


class LowerRng:
    """A random source whose uniform(a, b) always answers a."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.calls.append((a, b))
        return a


class NoRng:
    """A random source that must not be used."""

    def uniform(self, a: float, b: float) -> float:  # pragma: no cover - fails the test
        raise AssertionError("decide() drew a random number it did not need")


def _decide(policy: SlotPolicy = DEFAULT, **kwargs) -> Decision:
    args = dict(status=429, method="GET", has_idempotency_key=False, throttles=1, retry_after=None)
    args.update(kwargs)
    return decide(policy, **args)


def test_defaults_match_reference():
    assert DEFAULT.pad == 1.25
    assert DEFAULT.max_delay == 300.0
    assert DEFAULT.max_retries == 4
    assert DEFAULT.backoff_base == 1.0
    assert DEFAULT.backoff_max == 60.0
    assert DEFAULT.http_codes == frozenset({429, 503})


# --------------------------------------------------------------------------
# Retry-After present and within the cap: pad it
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "retry_after", "cooldown"),
    [
        (DEFAULT, 2.0, 2.5),
        (DEFAULT, 0.5, 0.625),
        (DEFAULT, 300.0, 375.0),  # exactly at the cap is still obeyed
        (SlotPolicy(pad=1.0), 7.0, 7.0),
        (SlotPolicy(pad=2.0), 7.0, 14.0),
        (SlotPolicy(max_delay=10.0), 10.0, 12.5),
    ],
)
@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_padded(policy, retry_after, cooldown, status):
    decision = _decide(policy, status=status, retry_after=retry_after, rng=NoRng())
    assert decision.retry is True
    assert decision.cooldown == pytest.approx(cooldown, rel=1e-12)
    assert decision.cooldown >= retry_after
    assert decision.refuse == 0.0
    assert decision.reason


# --------------------------------------------------------------------------
# Retry-After over the cap: refuse, no cooldown, no retry
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "retry_after"),
    [
        (DEFAULT, 301.0),
        (DEFAULT, 300.001),
        (DEFAULT, 86400.0),
        (DEFAULT, 1e20),
        (DEFAULT, math.inf),
        (SlotPolicy(max_delay=10.0), 11.0),
    ],
)
@pytest.mark.parametrize(("status", "method"), [(429, "GET"), (503, "GET"), (503, "POST"), (429, "POST")])
def test_over_the_cap_refuses(policy, retry_after, status, method):
    decision = _decide(policy, status=status, method=method, retry_after=retry_after, rng=NoRng())
    assert decision.retry is False
    assert decision.cooldown == 0.0
    assert decision.refuse == min(retry_after, 7 * 86400.0)  # finite: the slot's state can be freed
    assert decision.refuse > policy.max_delay
    assert "cap" in decision.reason


def test_infinite_retry_after_refuses_for_a_week_at_most():
    decision = _decide(retry_after=math.inf, rng=NoRng())
    assert decision.refuse == 7 * 86400.0
    assert decision.retry is False
    assert decision.cooldown == 0.0


# --------------------------------------------------------------------------
# No usable Retry-After: full-jitter backoff
# --------------------------------------------------------------------------


@pytest.mark.parametrize("retry_after", [None, 0.0])
@pytest.mark.parametrize(
    ("policy", "throttles", "ceiling"),
    [
        (DEFAULT, 1, 1.0),
        (DEFAULT, 2, 2.0),
        (DEFAULT, 3, 4.0),
        (DEFAULT, 4, 8.0),
        (DEFAULT, 6, 32.0),
        (DEFAULT, 7, 60.0),  # 64 capped at backoff_max
        (DEFAULT, 50, 60.0),
        (SlotPolicy(backoff_base=0.5, backoff_max=3.0), 1, 0.5),
        (SlotPolicy(backoff_base=0.5, backoff_max=3.0), 3, 2.0),
        (SlotPolicy(backoff_base=0.5, backoff_max=3.0), 4, 3.0),
        (SlotPolicy(backoff_base=5.0, backoff_max=5.0), 3, 5.0),
    ],
)
def test_backoff_bounds(retry_after, policy, throttles, ceiling):
    assert ceiling == min(policy.backoff_max, policy.backoff_base * 2 ** (throttles - 1))
    upper = UpperRng()
    decision = _decide(policy, throttles=throttles, retry_after=retry_after, max_retries=1000, rng=upper)
    assert decision.cooldown == ceiling
    assert upper.calls == [(0.0, ceiling)]
    assert decision.retry is True
    assert decision.refuse == 0.0

    lower = LowerRng()
    decision = _decide(policy, throttles=throttles, retry_after=retry_after, max_retries=1000, rng=lower)
    assert decision.cooldown == 0.0
    assert lower.calls == [(0.0, ceiling)]


@pytest.mark.parametrize("retry_after", [None, 0.0])
@pytest.mark.parametrize("throttles", [1, 2, 3, 5, 8, 20])
def test_backoff_with_real_rng_within_bounds(retry_after, throttles):
    rng = random.Random(throttles)
    ceiling = min(DEFAULT.backoff_max, DEFAULT.backoff_base * 2 ** (throttles - 1))
    for _ in range(200):
        decision = _decide(throttles=throttles, retry_after=retry_after, max_retries=100, rng=rng)
        assert 0.0 <= decision.cooldown <= ceiling


# --------------------------------------------------------------------------
# Retry budget
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "throttles", "max_retries", "retry"),
    [
        (DEFAULT, 1, None, True),
        (DEFAULT, 4, None, True),
        (DEFAULT, 5, None, False),
        (DEFAULT, 100, None, False),
        (SlotPolicy(max_retries=0), 1, None, False),
        (SlotPolicy(max_retries=1), 1, None, True),
        (SlotPolicy(max_retries=1), 2, None, False),
        # the per-request value overrides the policy in both directions
        (DEFAULT, 5, 10, True),
        (DEFAULT, 11, 10, False),
        (DEFAULT, 1, 0, False),
        (DEFAULT, 2, 1, False),
        (SlotPolicy(max_retries=0), 3, 3, True),
    ],
)
@pytest.mark.parametrize("retry_after", [None, 2.0])
def test_retry_budget(policy, throttles, max_retries, retry, retry_after):
    decision = _decide(
        policy, throttles=throttles, retry_after=retry_after, max_retries=max_retries, rng=UpperRng()
    )
    assert decision.retry is retry
    # the slot still cools down when the request is given up
    assert decision.cooldown > 0.0
    assert decision.refuse == 0.0


def test_exhausted_still_cools_with_retry_after():
    decision = _decide(throttles=5, retry_after=10.0, rng=NoRng())
    assert decision.retry is False
    assert decision.cooldown == 12.5
    assert "exhausted" in decision.reason


# --------------------------------------------------------------------------
# Idempotency
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "method", "key", "retry"),
    [
        (503, "POST", False, False),
        (503, "PATCH", False, False),
        (503, "post", False, False),
        (503, "patch", False, False),
        (503, "POST", True, True),
        (503, "PATCH", True, True),
        (500, "POST", False, False),
        (429, "POST", False, True),
        (429, "PATCH", False, True),
        (429, "POST", True, True),
        (503, "GET", False, True),
        (503, "HEAD", False, True),
        (503, "OPTIONS", False, True),
        (503, "PUT", False, True),
        (503, "DELETE", False, True),
        (503, "TRACE", False, True),
        (503, "get", False, True),
        (503, "put", False, True),
        (429, "GET", False, True),
    ],
)
@pytest.mark.parametrize("retry_after", [None, 3.0])
def test_idempotency(status, method, key, retry, retry_after):
    decision = _decide(
        status=status, method=method, has_idempotency_key=key, retry_after=retry_after, rng=UpperRng()
    )
    assert decision.retry is retry
    # the slot cools down either way: the server asked for it
    assert decision.cooldown > 0.0
    if retry_after is not None:
        assert decision.cooldown == retry_after * DEFAULT.pad
    if not retry:
        assert "Idempotency-Key" in decision.reason


@pytest.mark.parametrize(
    ("status", "method", "key", "outcome"),
    [
        (503, "POST", False, "not_repeatable"),
        (503, "PATCH", False, "not_repeatable"),
        (503, "POST", True, "over_cap"),
        (429, "POST", False, "over_cap"),
        (503, "GET", False, "over_cap"),
    ],
)
def test_idempotency_is_checked_before_the_cap(status, method, key, outcome):
    decision = _decide(status=status, method=method, has_idempotency_key=key, retry_after=3600.0)
    assert decision.retry is False
    assert decision.outcome == outcome
    # The slot is refused until the host's time either way; only the request's fate differs.
    assert decision.refuse == 3600.0
    assert decision.cooldown == 0.0
    assert "over the 300s cap" in decision.reason


def test_idempotent_methods_set():
    assert IDEMPOTENT_METHODS == {"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"}
    assert "POST" not in IDEMPOTENT_METHODS
    assert "PATCH" not in IDEMPOTENT_METHODS


# --------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0.001, max_value=300.0))
def test_cooldown_is_padded_retry_after(retry_after):
    decision = _decide(retry_after=retry_after, rng=NoRng())
    assert decision.retry is True
    assert decision.cooldown == retry_after * DEFAULT.pad
    assert decision.cooldown >= retry_after
    assert decision.refuse == 0.0


@settings(max_examples=300, deadline=None)
@given(
    st.floats(min_value=0.001, max_value=1e6),
    st.floats(min_value=1.0, max_value=10.0),
    st.floats(min_value=0.001, max_value=1e6),
)
def test_cooldown_never_shortens_any_policy(retry_after, pad, max_delay):
    policy = SlotPolicy(pad=pad, max_delay=max_delay)
    decision = _decide(policy, retry_after=retry_after, rng=NoRng())
    if retry_after > max_delay:
        assert decision.retry is False
        assert decision.refuse == min(retry_after, 7 * 86400.0)
        assert decision.cooldown == 0.0
    else:
        assert decision.cooldown == retry_after * pad
        assert decision.cooldown >= retry_after


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=10_000),
    st.one_of(st.none(), st.just(0.0)),
    st.integers(min_value=0, max_value=2**32),
)
def test_backoff_cooldown_bounded(throttles, retry_after, seed):
    decision = _decide(throttles=throttles, retry_after=retry_after, rng=random.Random(seed))
    assert 0.0 <= decision.cooldown <= DEFAULT.backoff_max
    assert decision.cooldown <= DEFAULT.backoff_base * 2.0 ** min(throttles - 1, 1000)


_ANY_FLOAT = st.one_of(st.none(), st.floats(), st.sampled_from([math.inf, -math.inf, math.nan, 1e308, -0.0, 5e-324]))


@settings(max_examples=500, deadline=None)
@given(
    retry_after=_ANY_FLOAT,
    previous_wait=_ANY_FLOAT,
    strategy=st.sampled_from(sorted(STRATEGIES)),
    throttles=st.integers(min_value=1, max_value=10**6),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_no_number_makes_a_decision_unbounded(retry_after, previous_wait, strategy, throttles, seed):
    """A Retry-After or a last wait of any value, even one a parser should never give: a bounded decision."""
    policy = SlotPolicy(backoff_strategy=strategy)
    decision = decide(
        policy, status=429, method="GET", has_idempotency_key=False, throttles=throttles,
        retry_after=retry_after, rng=random.Random(seed), previous_wait=previous_wait,
    )
    assert math.isfinite(decision.cooldown)
    assert 0.0 <= decision.cooldown <= max(policy.max_delay * policy.pad, policy.backoff_max)
    assert 0.0 <= decision.refuse <= 7 * 86400.0
    assert decision.refuse == 0.0 or decision.cooldown == 0.0


# --------------------------------------------------------------------------
# the spider's own status handling (as Scrapy's HttpErrorMiddleware reads it)
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("meta", "spider_codes", "allow_all", "allowed_codes", "handles"),
    [
        ({}, None, False, [], False),
        ({"handle_httpstatus_list": [429]}, None, False, [], True),
        ({"handle_httpstatus_list": [503]}, None, False, [], False),
        ({"handle_httpstatus_all": True}, None, False, [], True),
        ({"handle_httpstatus_all": False}, None, False, [], False),
        ({}, [429], False, [], True),
        ({}, None, False, [429], True),
        ({}, None, True, [], True),
        # The meta list overrides HTTPERROR_ALLOW_ALL; the spider attribute overrides the setting's codes.
        ({"handle_httpstatus_list": []}, None, True, [], False),
        ({}, [404], False, [429], False),
        ({}, [404], True, [], True),
        # Not a collection of codes: allows nothing, never raises.
        ({"handle_httpstatus_list": None}, None, False, [], False),
        ({}, 429, False, [], False),
    ],
)
def test_spider_handles_as_httperror_middleware_does(meta, spider_codes, allow_all, allowed_codes, handles):
    assert spider_handles(429, meta, spider_codes, allow_all=allow_all, allowed_codes=allowed_codes) is handles
