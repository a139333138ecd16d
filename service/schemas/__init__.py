"""Request and response schemas of the HTTP API, one module per resource (STYLE 13).

Requests forbid unknown fields and carry the hard limits of the libraries; the service's own
limits are settings, checked in the routes (``service.limits``). Responses never carry key
material: the public key schema has no secret field at all.
"""
