"""Decoding: the keyed race's policies, the draft tree and the one step loop, over a target and
a drafter.

The rooms: ``sampler.targets`` (the model P, its backends, loading files), ``sampler.drafters``
(the proposals Q), this package's own modules (the decoding core: processing, top-k, race,
policies, tree, methods, loop, decoder, batch, completion, the tree chooser ``autotree``,
entropy, baselines; ``models`` loads a target and warms the core's kernels) and
``sampler.training`` (the drafters' trainers). Arrows point down that list's reverse: the core
imports drafters and targets, drafters import targets, targets import neither; the trainers
import everything and nothing imports them. The package imports ``keyed`` and never
``detector`` or ``service``.

In this package "the MPFR paper" is *Watermarkable Multi-Draft Speculative Sampling via
Poisson Processes* (Liu, Wan, Gao, Gündüz; arXiv:2609.21858), see docs/design.md.

Importing the package sets ``OMP_WAIT_POLICY=PASSIVE`` where the bfloat16 runner is the CPU
default and nothing else set it (``sampler.targets.cpu_features.prefer_passive_omp_wait``).
"""

from sampler.targets.cpu_features import prefer_passive_omp_wait

prefer_passive_omp_wait()
