"""``python -m ckptlab models``: the presets, as a table or JSON."""

from __future__ import annotations

import argparse
import json

from ..model.presets import DEFAULT_PRESET, stored_facts
from ..show.i18n import t
from ..show.report import models_table


def add_models_command(commands) -> None:
    models = commands.add_parser("models", help="list the model presets")
    models.add_argument("--json", action="store_true", help="print the list as JSON")
    models.set_defaults(handler=_models)


def _models(args: argparse.Namespace) -> int:
    # The presets' facts as stored (tests/model/test_preset_facts.py describes each and compares): no model is
    # built and torch is not imported, so the list prints at once.
    infos = stored_facts()
    if args.json:
        print(json.dumps([info.to_dict() for info in infos], indent=2))
    else:
        print(models_table(infos))
        print("\n" + t("cli.models_default", preset=DEFAULT_PRESET))
    return 0
