"""The core's progress lines and a simulation's notes are facts: worded from the locale files, in English as they
always were (the command line prints them), and every word of them in pt-BR and ja on a page, prefixes included."""

from __future__ import annotations

import json
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
TECHNICAL |= {"sdpa", "cuda", "flash", "kernel", "logsumexp", "float32", "heads", "backward"}  # a simulated SDPA call


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
        "n=1: simulating shallow step 1 of 1: a copy of 3 layers that stands for all 6",  # steps shared (step.table)
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
    assert [note.key for note in notes] == [
        "note.only_first_layer",
        "note.sdpa_kernel_flash",
        "note.offload_simulated",
        "note.fsdp_simulated",
    ]
    lines = list(dict.fromkeys(said)) + notes
    for lang in LANGS:
        assert all(i18n.say(line, lang) != i18n.say(line) for line in lines), lang
        assert _english_left(lines, lang) == {}, lang


# Names and terms the prediction's and the Trainer report's facts keep in English in every language.
KEPT_ENGLISH = {"lora", "peft", "float32", "bfloat16", "dtype", "grouped_mm", "top-k", "mlp", "mlps", "ckptlab"}
KEPT_ENGLISH |= {"simulate", "experts", "expert", "mixture", "olmoe", "backward", "forward", "tiny", "rerun", "mib"}
KEPT_ENGLISH |= {"trainer", "trainingarguments", "context_fn", "create_selective_checkpoint_contexts", "mismatch"}
KEPT_ENGLISH |= {"activation_checkpointing", "use_reentrant", "checkpointingcallback", "observe_step", "ops", "cpu"}
KEPT_ENGLISH |= {"memtracker", "llama", "attention", "aten", "true", "false", "bf16", "training-args", "run", "moe"}
KEPT_ENGLISH |= {"save_on_cpu"}  # torch.autograd.graph.save_on_cpu, an API name
KEPT_ENGLISH |= {"lab", "fine-tune", "checkpoint", "checkpointable", "transformers", "token", "tokens", "tensor"}
KEPT_ENGLISH |= {"presets", "flag", "keep", "torch", "matmuls", "micro-batches", "reruns"}


def _english_left_but_terms(facts: list[Fact], lang: str) -> dict[str, set[str]]:
    left = _english_left(facts, lang)
    return {sentence: words - KEPT_ENGLISH for sentence, words in left.items() if words - KEPT_ENGLISH}


def test_a_predictions_notes_are_facts_said_in_every_language():
    from transformers import OlmoeConfig

    from ckptlab import predict

    moe = OlmoeConfig(
        hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_experts=4, num_experts_per_tok=2,
        vocab_size=512, max_position_embeddings=256, num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    rows = [
        *predict(moe, seq_len=32, num_layers=2, every_n_layers=[1]),
        *predict("tiny-qwen3-moe", seq_len=32, every_n_layers=[1], optimizer="none"),
        *predict("tiny-llama", seq_len=32, every_n_layers=[1], lora_rank=4),
    ]
    facts = list(dict.fromkeys(fact for row in rows for fact in row.facts))
    assert {fact.key for fact in facts} == {
        "predict.experts_not_counted",
        "predict.experts_counted",
        "predict.backward_peak",
        "predict.lora_activations",
    }
    for row in rows:  # the notes read as they always did: the facts' English, in the JSON too
        assert row.notes == tuple(i18n.say(fact) for fact in row.facts) and row.to_dict()["notes"] == row.notes
        assert [Fact.from_dict(fact) for fact in row.to_dict()["facts"]] == list(row.facts)
    for lang in LANGS:
        assert all(i18n.say(fact, lang) != i18n.say(fact) for fact in facts), lang
        assert _english_left_but_terms(facts, lang) == {}, lang


def test_the_trainer_reports_lines_are_facts_said_in_every_language():
    from ckptlab.integrations.trainer import CheckpointingReport
    from ckptlab.integrations.trainer_setting import RequestedSetting
    from ckptlab.results import LayerResult, MemoryResult
    from ckptlab.results.run import Region

    def layer(index: int, planned: str, enabled: str, **selective: object) -> LayerResult:
        return LayerResult(index, f"L{index + 1}", "LlamaDecoderLayer", planned, enabled, 1, 1, 10, 5, **selective)  # type: ignore[arg-type]

    memory = MemoryResult("MemTracker", 3 << 20, 2 << 20, 9 << 20, Region(kind="phase", phase="backward"))
    kept = {"selective": "attention", "kept_bytes": 4096, "kept_ops": {"aten.mm": 2}, "rerun_ops": {"aten.mm": 3}}
    reports = [
        CheckpointingReport(
            1, "Llama", "cpu", RequestedSetting(True, 2, False, {}, False, "-"), None,
            [layer(0, "CP", "CP", **kept), layer(1, "keep", "CP"), layer(2, "CP", "CP", selective="attention")],
            memory, 2, {"bf16": True}, [Fact("trainer.warn_offload_on_cpu")],
            [Fact("trainer.optimizer_state_created", {"mib": "3.0"}), Fact("trainer.micro_batches", {"micro_batches": 2})],
        ),
        CheckpointingReport(
            1, "Llama", "cpu", RequestedSetting(False, None, False, {"context_fn": 1}, True, "-"), None,
            [layer(0, "CP", "CP"), layer(1, "keep", "keep")], memory, 1,
        ),
        CheckpointingReport(
            1, "Llama", "cpu", RequestedSetting(True, 1, False, {}, False, "-"), None,
            [layer(0, "CP", "CP", selective="matmuls")], memory, 1,
        ),
    ]  # fmt: skip
    lines = [line for report in reports for line in report.text_facts()]
    facts = list(dict.fromkeys(line for line in lines if isinstance(line, Fact)))
    keys = {fact.key for fact in facts}
    assert {"trainer.mismatch", "trainer.selective_kept", "trainer.context_fn_kept_nothing_in"} <= keys
    assert {"trainer.asked_off", "trainer.context_fn_kept_nothing", "trainer.selective_no_op"} <= keys
    assert {"trainer.matches", "trainer.note", "trainer.warning", "trainer.training_args"} <= keys
    (mismatch,) = [
        line for line in reports[0].text_facts() if isinstance(line, Fact) and line.key == "trainer.mismatch"
    ]
    assert [row.params["layer"] for row in mismatch.params["rows"]] == ["L2"]  # its rows: a tuple of facts
    assert Fact.from_dict(json.loads(json.dumps(mismatch.to_dict()))) == mismatch
    english = reports[0].text()
    assert reports[0].text("en") == english and "note: 2 micro-batches in this step" in english
    assert reports[0].to_dict()["notes"] == reports[0].notes == [i18n.say(fact) for fact in reports[0].facts]
    for lang in LANGS:
        assert all(i18n.say(fact, lang) != i18n.say(fact) for fact in facts), lang
        assert _english_left_but_terms(facts, lang) == {}, lang
        assert reports[0].text(lang) != english


def test_a_runs_plan_mismatch_names_each_layer_in_a_fact_of_its_own():
    """The rows of note.plan_mismatch are facts (a layer, its plan, its flag, what it did), worded in each language."""
    from ckptlab.results import LayerResult
    from ckptlab.step.measure import plan_mismatch_note

    layers = [
        LayerResult(index, f"L{index + 1}", "LlamaDecoderLayer", planned, enabled, 1, 1, 10, 5)  # type: ignore[arg-type]
        for index, (planned, enabled) in enumerate([("CP", "CP"), ("keep", "CP"), ("CP", "keep")])
    ]
    note = plan_mismatch_note(layers)
    assert [row.params["layer"] for row in note.params["rows"]] == ["L2", "L3"]
    assert i18n.say(note).endswith(": L2: planned keep, flag CP, observed CP, L3: planned CP, flag keep, observed CP")
    for lang in LANGS:  # the note's head keeps its marker, PLAN MISMATCH, in every language; its rows are words
        assert _english_left_but_terms(list(note.params["rows"]), lang) == {}, lang
