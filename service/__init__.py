"""The poissonmark service: keys in Redis, the HTTP API, the CLI, in rooms by job.

From the bottom: the base modules here (``settings``, ``errors``: the domain exceptions and
their one problem table, ``metrics``, ``contract``: what the served document states,
``ratelimit``: the Redis counters); ``keys`` (key custody); ``schemas`` (the wire format);
``jobs`` (generation, detection, the lifespan's resources); ``admission`` (a request's checks
and charges, one call per route); ``http`` (the app and its routes); ``server`` (uvicorn);
``cli`` (``poissonmark``); ``ray``. Each imports only rooms before it in that list
(``tests/test_architecture.py``), and ``sampler``, ``detector``, ``keyed``.
"""

import sampler  # noqa: F401  # first: it sets the OpenMP wait policy before anything loads torch
