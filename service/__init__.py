"""The poissonmark service: key store (Redis), settings, auth, HTTP routes."""

import sampler  # noqa: F401  # first: it sets the OpenMP wait policy before anything loads torch
