"""The work the service does for a request: generation (``generation``, run by the continuous
batching ``worker``), detection (``detection``, on the ``detection_pool``, answered as one
typed ``detect_response``), the tests that read the model (``model_tests``), and the lifespan's
heavy resources that hold them (``resources``: Redis clients, key store, model, worker, pool).

May import: ``sampler``, ``detector``, ``keyed``, ``service.keys``, ``service.schemas`` (a
job's input and output are the wire schemas) and the service's base modules (``settings``,
``errors``, ``metrics``, ``contract``, ``ratelimit``). Never admission or the HTTP layer.
"""
