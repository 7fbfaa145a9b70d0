"""The core's progress lines and a simulation's notes are facts: worded from the locale files, in English as they
always were (the command line prints them), and every word of them in pt-BR and ja on a page, prefixes included."""

from __future__ import annotations

import re

import pytest

from ckptlab import RunSpec, simulate
from ckptlab.cli.args import print_progress
from ckptlab.explore.scale import scale_table
from ckptlab.explore.sweep import SweepSpec, sweep
from ckptlab.fact import Fact
from ckptlab.lab.run import ResultCache, run_queued
from ckptlab.lab.runqueue import DeviceQueue
from ckptlab.show import i18n
from ckptlab.spec import Setting
from ckptlab.step import stopping
from ckptlab.step.preflight import load_model
from ckptlab.step.stopping import DONE, prefixed, scaled

LANGS = ("pt-BR", "ja")
# Words that stay English in every language (i18n's technical terms, names, the lab's setting keys).
TECHNICAL = {"seq", "off", "offload", "checkpointing", "checkpointed", "every_n_layers", "tiny-llama", "tiny-gpt2"}
TECHNICAL |= {"fsdp2", "ranks", "rank", "fake", "process", "group", "shards", "host", "host_offload_bytes", "gpu"}
TECHNICAL |= {"bytes"}  # pt-BR says bytes too


def _words(text: str) -> set[str]:
    return {word.lower() for word in re.findall(r"[A-Za-z][A-Za-z0-9_-]{2,}", text)} - TECHNICAL


def _english_left(facts: list[Fact], lang: str) -> dict[str, set[str]]:
    """Each fact's English whose ``lang`` text still holds a word of the facts' English, with those words."""
    english = set().union(*(_words(i18n.say(fact)) for fact in facts))
    left = {i18n.say(fact): _words(i18n.say(fact, lang)) & english for fact in facts}
    return {sentence: words for sentence, words in left.items() if words}


def test_say_says_a_facts_fact_params_in_the_same_language():
    label = Fact("progress.row", {"row": 1, "rows": 2, "seq_len": 32, "setting": "n=2"})
    line = prefixed(Fact("progress.row_memory", {"label": label}), DONE)
    assert line.key == "progress.prefixed" and line.params["message"] is DONE
    assert i18n.say(line, "en") == "row 1 of 2: seq 32, n=2: memory: done"
    assert i18n.say(line, "pt-BR") == "linha 1 de 2: seq 32, n=2: memória: concluído"
    assert i18n.say(line, "ja") == "2 行中 1 行目: seq 32、n=2: メモリ: 完了"
    keyed = prefixed(stopping.label("n=2"), DONE)  # a setting's key as the prefix stays as it is
    assert i18n.say(keyed, "ja") == "n=2: 完了" and prefixed(None, DONE) is DONE


def test_scaled_keeps_the_keys_of_its_prefix_and_of_the_message():
    seen: list[tuple[Fact, float]] = []
    report = scaled(lambda message, fraction: seen.append((message, fraction)), 1, 2, stopping.label("n=1"))
    report(DONE, 0.5)
    ((message, fraction),) = seen
    assert (i18n.say(message), fraction) == ("n=1: done", 0.75)
    assert message.params == {"prefix": Fact("progress.label", {"label": "n=1"}), "message": DONE}


def test_a_fact_survives_pickling_and_json_and_equal_facts_hash_alike():
    import json
    import pickle

    line = prefixed(Fact("progress.reference"), Fact("progress.timed_step", {"step": 2, "steps": 3}))
    assert pickle.loads(pickle.dumps(line)) == line  # a worker process sends its progress to the app
    assert Fact.from_dict(json.loads(json.dumps(line.to_dict()))) == line
    assert hash(Fact("progress.timed_step", {"step": 2, "steps": 3})) == hash(line.params["message"])


def test_the_command_line_prints_a_nested_fact_in_the_same_english(capsys):
    reference = Fact("progress.reference")
    print_progress(prefixed(reference, Fact("progress.timed_step", {"step": 2, "steps": 3})), 0.5)
    printed = capsys.readouterr().err
    assert printed == "\r[ 50%] " + f"{'checkpointing off (reference): timed step 2 of 3':<50}"
    print_progress(DONE, 1.0)
    assert capsys.readouterr().err == f"\r[100%] {'done':<50}"


@pytest.mark.slow
def test_real_progress_and_simulation_notes_say_themselves_in_every_language():
    said: list[Fact] = []

    def collect(message: Fact, fraction: float) -> None:
        said.append(message)

    load_model(RunSpec(model="tiny-llama", seq_len=32, device="cpu"), progress=collect)
    simulated = simulate(
        RunSpec(model="tiny-llama", seq_len=64, every_n_layers=6, offload=True, world_size=2, fsdp=True),
        progress=collect,
    )
    scale_table("tiny-llama", 64, 1, "bfloat16", [Setting(None, False), Setting(1, False)], progress=collect)
    run_queued(
        RunSpec(model="tiny-gpt2", seq_len=32, every_n_layers=1, warmup=1, repeats=1, optimizer="none", device="cpu"),
        progress=collect,
        queue=DeviceQueue(),
        cache=ResultCache(),
    )
    sweep(
        SweepSpec(model="tiny-gpt2", seq_lens=(32,), every_n_layers=(1,), repeats=1, warmup=1, optimizer="none"),
        progress=collect,
    )
    # The English is what it was before the lines became facts (the command line prints it).
    english_said = [i18n.say(fact) for fact in said]
    for english in (
        "building tiny-llama (13.8M parameters, random weights)",
        "simulating all 6 layers of tiny-llama",
        "n=1: simulating 3 of 6 layers",  # the table shares shallow steps between its settings (step.table)
        "off: done",
        "waiting for the device",
        "warm-up step 1 of 1",
        "timed step 1 of 1",
        "memory step (observed, untimed)",
        "checkpointing off (reference): timed step 1 of 1",
        "row 1 of 2: seq 32, off: building the model",
        "row 2 of 2: seq 32, n=1: memory: memory step (observed, untimed)",
        "seq 32: 2 settings timed interleaved: timed round 1 of 1",
        "sweep done",
        "done",
    ):
        assert english in english_said, english
    assert all(isinstance(message, Fact) for message in said), [m for m in said if not isinstance(m, Fact)]
    notes = simulated.notes
    assert [note.key for note in notes] == ["note.only_first_layer", "note.offload_simulated", "note.fsdp_simulated"]
    lines = list(dict.fromkeys(said)) + notes
    for lang in LANGS:
        assert all(i18n.say(line, lang) != i18n.say(line) for line in lines), lang
        assert _english_left(lines, lang) == {}, lang
