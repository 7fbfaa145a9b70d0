"""The core's progress lines and a simulation's notes are Messages: English as they always were (the command
line prints them as they are), and every word of them said in pt-BR and ja on a page, prefixes included."""

from __future__ import annotations

import re

import pytest

from ckptlab import RunSpec, simulate
from ckptlab.cli.args import print_progress
from ckptlab.explore.scale import scale_table
from ckptlab.explore.sweep import SweepSpec, sweep
from ckptlab.lab.run import ResultCache, run_queued
from ckptlab.lab.runqueue import DeviceQueue
from ckptlab.message import Message
from ckptlab.show import i18n
from ckptlab.spec import Setting
from ckptlab.step.preflight import load_model
from ckptlab.step.stopping import DONE, prefixed, scaled

LANGS = ("pt-BR", "ja")
# Words that stay English in every language (i18n's technical terms, names, the lab's setting keys).
TECHNICAL = {"seq", "off", "offload", "checkpointing", "checkpointed", "every_n_layers", "tiny-llama", "tiny-gpt2"}
TECHNICAL |= {"fsdp2", "ranks", "rank", "fake", "process", "group", "shards", "host", "host_offload_bytes", "gpu"}
TECHNICAL |= {"bytes"}  # pt-BR says bytes too


def _words(text: str) -> set[str]:
    return {word.lower() for word in re.findall(r"[A-Za-z][A-Za-z0-9_-]{2,}", text)} - TECHNICAL


def _english_left(messages: list[str], lang: str) -> dict[str, set[str]]:
    """Each message whose ``lang`` text still holds a word of the messages' English, with those words."""
    english = set().union(*(_words(message) for message in messages))
    left = {message: _words(i18n.say(message, lang)) & english for message in messages}
    return {message: words for message, words in left.items() if words}


def test_say_says_a_messages_message_params_in_the_same_language():
    inner = Message("done", key="progress.done")
    label = Message(
        "row 1 of 2: seq 32, n=2", key="progress.row", params={"row": 1, "rows": 2, "seq_len": 32, "setting": "n=2"}
    )
    prefix = Message(f"{label}: memory: ", key="progress.row_memory", params={"label": label})
    line = prefixed(prefix, inner)
    assert line == "row 1 of 2: seq 32, n=2: memory: done" and line.key == "progress.prefixed"
    assert i18n.say(line, "en") == line.text
    assert i18n.say(line, "pt-BR") == "linha 1 de 2: seq 32, n=2: memória: concluído"
    assert i18n.say(line, "ja") == "2 行中 1 行目: seq 32、n=2: メモリ: 完了"
    plain = prefixed("n=2: ", inner)  # a plain prefix (a setting's key) stays as it is
    assert i18n.say(plain, "ja") == "n=2: 完了" and prefixed("", inner) is inner


def test_scaled_keeps_the_keys_of_its_prefix_and_of_the_message():
    seen: list[tuple[str, float]] = []
    report = scaled(lambda message, fraction: seen.append((message, fraction)), 1, 2, "n=1: ")
    report(DONE, 0.5)
    ((message, fraction),) = seen
    assert (message, fraction) == ("n=1: done", 0.75)
    assert isinstance(message, Message) and message.params == {"prefix": "n=1: ", "message": DONE}


def test_the_command_line_prints_a_nested_message_in_the_same_english(capsys):
    reference = Message("checkpointing off (reference): ", key="progress.reference")
    print_progress(
        prefixed(reference, Message("timed step 2 of 3", key="progress.timed_step", params={"step": 2, "steps": 3})),
        0.5,
    )
    printed = capsys.readouterr().err
    assert printed == "\r[ 50%] " + f"{'checkpointing off (reference): timed step 2 of 3':<50}"
    print_progress("plain words", 1.0)
    assert capsys.readouterr().err == f"\r[100%] {'plain words':<50}"


@pytest.mark.slow
def test_real_progress_and_simulation_notes_say_themselves_in_every_language():
    said: list[str] = []

    def collect(message: str, fraction: float) -> None:
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
    # The English is what it was before the lines became Messages (the command line prints it).
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
        assert english in said, english
    assert all(isinstance(message, Message) for message in said), [m for m in said if not isinstance(m, Message)]
    notes = simulated.notes
    assert len(notes) == 3 and all(isinstance(note, Message) for note in notes)  # only L1, offload, FSDP2
    lines = list(dict.fromkeys(said)) + notes
    for lang in LANGS:
        assert all(i18n.say(line, lang) != line.text for line in lines), lang
        assert _english_left(lines, lang) == {}, lang
