"""Plotly figures: a result (or a sweep, a table, a plan) in, a figure out; one module per picture.

- ``diagram``: the CP / keep / rerun diagram of a run, of a plan, or of given roles.
- ``run``: measured runs as bars: a run beside checkpointing off, several settings, offload's share.
- ``timeline``: memory through one step, and what each layer holds at one moment of it.
- ``tradeoff``: a sweep: peak against step time (Pareto), memory against sequence length, through the step.
- ``prediction``: a prediction beside the measurement (the formula's, or a participant's guess).
- ``breakdown``: the memory at a step's peak by category, and one GPU's parts under sharding.
- ``scale``: the At-scale table: each setting's simulated peak against a GPU.
- ``room``: the instructor's room: the class's predictions beside the measured answer.
- ``_style``: the one font and palette.

The words on them come from :mod:`ckptlab.show.i18n` and :mod:`ckptlab.show.labels`.
"""
