"""loadgen imports no service, so it declares the units of time itself: they must be the
services' (services/core/constants.py)."""

from tideshift.loadgen.core import profiles
from tideshift.services.core import constants


def test_loadgen_units_of_time_are_the_services() -> None:
    assert (profiles.HOUR_S, profiles.DAY_S, profiles.WEEK_S) == (
        constants.HOUR_S,
        constants.DAY_S,
        constants.WEEK_S,
    )
