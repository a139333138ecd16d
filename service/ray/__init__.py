"""Ray: a detection corpus on Ray Data (``corpus``, ``detect --jsonl --engine ray``) and the
HTTP app as a Ray Serve deployment (``serve``). Needs the ``ray`` extra; nothing else imports
it.

May import: ``service.jobs`` (the corpus run whose lines it writes), ``service.http`` (the
app it serves) and what they may; never the CLI.
"""
