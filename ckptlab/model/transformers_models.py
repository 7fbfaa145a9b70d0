"""Importing this module imports ``transformers.models`` with its model folders scanned once, not twice.

``ckptlab.model.libraries.import_transformers_models`` says why (about 0.33 s of CPU a process). A module of its own so
that a module whose top-level imports reach ``transformers.models`` (a modeling module, ``transformers.modeling_utils``,
the auto classes) can import it before them: ``ckptlab.step.simulate``.
"""

from __future__ import annotations

from .libraries import import_transformers_models

import_transformers_models()
