"""HTTP routes, one module per resource (STYLE 13): thin handlers over typed dependencies,
each reading "parse, admit, run, answer".

May import: the rest of ``service.http`` and what it may.
"""
