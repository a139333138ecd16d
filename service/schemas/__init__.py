"""Request and response schemas of the HTTP API, one module per resource (STYLE 13).

Requests forbid unknown fields and carry the hard limits of the libraries; the service's own
limits are settings, checked at admission (``service.admission``). Responses never carry key
material: the public key schema has no secret field at all.

A room of its own below the jobs, not inside ``service.http``: a job's input and output are
these schemas (``service.jobs.generation`` takes a ``GenerateRequest``, the detection pool
answers ``DetectResponse``), as are the CLI's ``--json`` lines.

May import: ``service.keys`` (a key's public record), ``service.errors``, ``sampler`` and
``detector`` (the methods' and scores' names, the bands), ``keyed``.
"""
