"""HTTP routes, one module per resource (STYLE 13): thin handlers over typed dependencies."""
