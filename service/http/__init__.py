"""The HTTP layer: the FastAPI ``app`` and its lifespan, typed dependencies (``deps``), bearer
authentication (``auth``), middleware, the problem+json rendering (``problems``), the OpenAPI
document (``openapi``), server-sent events (``streaming``), the OpenAI wire format
(``openai_compat``, ``openai_errors``), the routes (``routes/``, one module per resource) and
the web page (``web/``).

A route reads "parse, admit, run, answer": the body is parsed by its schema, admitted by one
call to ``service.admission``, run by a job, answered.

May import: everything of the service below it (``admission``, ``jobs``, ``schemas``,
``keys``, the base modules), ``sampler``, ``detector``, ``keyed``. Never the CLI, the server
or Ray.
"""
