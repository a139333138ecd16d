"""Key custody: watermark key records in Redis (``store``, ``record``, ``page``), their
rotation under a new KEK (``rotation``), the KEK itself (``kek``), API bearer tokens
(``api_tokens``) and the Redis connection, embedded or remote, with its supervision
(``redis``).

May import: ``keyed`` (a key's secret and parameters), ``service.errors`` and each other.
Never ``sampler`` (nothing here needs a model; ``tests/test_architecture.py`` holds it), nor
the jobs, admission or the HTTP layer.
"""
