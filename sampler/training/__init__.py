"""Training the drafters: target rollouts, the MDraft objective, the heads' and the eagle
head's trainers and the optimiser they share (``poissonmark distill``, ``bench/train_eagle.py``).

May import: everything in ``sampler`` (the core decodes the rollouts; the drafters are what
is trained) and ``keyed``. Nothing in ``sampler`` imports it.
"""
