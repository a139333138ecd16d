"""Decoding: the target, drafters, the keyed race's policies and the one step loop.

In this package "the MPFR paper" is *Watermarkable Multi-Draft Speculative Sampling via
Poisson Processes* (Liu, Wan, Gao, Gündüz; arXiv:2609.21858), see docs/design.md.

Importing the package sets ``OMP_WAIT_POLICY=PASSIVE`` where the bfloat16 runner is the CPU
default and nothing else set it (``sampler.cpu_features.prefer_passive_omp_wait``).
"""

from sampler.cpu_features import prefer_passive_omp_wait

prefer_passive_omp_wait()
