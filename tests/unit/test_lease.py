"""The worker's own view of its lease (docs/design.md §15): messages start only while a renewal
confirmed it within lease - margin, and only under the term a batch was claimed under."""

from __future__ import annotations

import time

import pytest

from workers.core.settings import ConfigError, load
from workers.delivery.lease import Lease


def test_a_confirmed_lease_is_valid_until_lease_minus_margin_from_the_ask() -> None:
    lease = Lease(seconds=3.0, margin=1.0)
    assert not lease.valid() and lease.current() is None  # never confirmed
    asked = time.monotonic()
    assert lease.confirm(asked, 0) is None
    assert lease.valid() and lease.valid(0) and lease.current() == 0
    assert not lease.valid(1)  # another term's batch
    lease.confirm(asked - 2.5, 0)  # asked 2.5 s ago: good until 0.5 s ago
    assert not lease.valid(0) and lease.current() is None
    assert lease.ran_out() is not None and lease.ran_out() is None  # said once


def test_a_new_term_voids_the_old_one() -> None:
    lease = Lease(seconds=30.0, margin=10.0)
    lease.confirm(time.monotonic(), 4)
    assert lease.confirm(time.monotonic(), 5) == 4
    assert lease.valid(5) and not lease.valid(4)


def test_the_lease_is_held_without_a_break_only_across_timely_renewals() -> None:
    lease = Lease(seconds=30.0, margin=10.0)
    now = time.monotonic()
    lease.confirm(now - 25, 0)
    lease.confirm(now - 10, 0)  # within the previous one's validity: unbroken
    assert lease.held_for() >= 25
    lease.confirm(now, 1)  # a new term starts a new run
    assert lease.held_for() < 1


def test_lease_settings() -> None:
    config = load({"SECRET_KEY": "x"})
    assert (config.worker_timeout, config.lease_grace, config.lease_margin) == (30, 10, 10)
    # The defaults meet P4's 60 s: expiry + grace + the rescuer's 5 s.
    assert config.worker_timeout + config.lease_grace + 5 <= 60
    # A margin that would leave no time to send is cut to half of lease - heartbeat.
    assert load({"SECRET_KEY": "x", "WORKER_TIMEOUT": "5", "HEARTBEAT_INTERVAL": "1"}
                ).lease_margin == 2
    with pytest.raises(ConfigError, match="SENDDOCK_WORKER_TIMEOUT"):
        load({"SECRET_KEY": "x", "WORKER_TIMEOUT": "5", "HEARTBEAT_INTERVAL": "5"})
