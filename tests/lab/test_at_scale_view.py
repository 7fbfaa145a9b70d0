"""The At-scale page's words and decisions (ckptlab.lab.at_scale_view) that the page used to work out itself."""

from __future__ import annotations

from dataclasses import replace

import ckptlab
from ckptlab.explore.gpu_search import SearchCode
from ckptlab.explore.scale import ScaleRequest, scale_settings
from ckptlab.lab import at_scale_view
from ckptlab.lab.at_scale_view import CUSTOM, DEFAULT, DEFAULT_BUDGET_GIB
from ckptlab.lab.modelbox import LOCAL
from ckptlab.show import i18n
from ckptlab.spec import RunSpec
from ckptlab.units import GIB


def test_a_links_gpu_is_a_listed_gpu_a_budget_in_gib_or_nothing():
    assert at_scale_view.gpu_from_link("H100 80 GB") == ("H100 80 GB", DEFAULT_BUDGET_GIB, [])
    assert at_scale_view.gpu_from_link("h200") == ("H200 141 GB", DEFAULT_BUDGET_GIB, [])
    assert at_scale_view.gpu_from_link("24GiB") == (CUSTOM, 24.0, [])
    assert at_scale_view.gpu_from_link("0")[:2] == (CUSTOM, 0.01)  # at least 0.01 GiB, and the link is told so
    clamped = at_scale_view.gpu_from_link("99999")[2][0]
    assert (clamped.params["used"], clamped.params["unit"]) == (4096, "GiB")
    # A size as --budget reads it (units.size_in_bytes, the one parser), a bare number in the box's GiB; an exponent,
    # which --budget does not take either, is no budget.
    assert at_scale_view.gpu_from_link("512MiB") == (CUSTOM, 0.5, [])
    assert at_scale_view.gpu_from_link("1e308") is None
    assert at_scale_view.gpu_from_link("a toaster") is None
    assert at_scale_view.gpu_from_link("nan") is None and at_scale_view.gpu_from_link("-inf") is None


def test_budgets_in_bytes_and_words():
    assert at_scale_view.budget("H100 80 GB", 12.0) == (80 * GIB, "H100 80 GB")
    assert at_scale_view.budget(CUSTOM, 12.5) == (int(12.5 * GIB), "12.5 GiB")
    assert at_scale_view.budget(CUSTOM, 12.5, "pt-BR") == (int(12.5 * GIB), "12,5 GiB")  # the language's decimal mark


def _values(**changes) -> dict:
    spec = RunSpec(model="qwen3-8b", seq_len=4096, batch_size=2, dtype="auto", optimizer="adamw", lora_rank=8)
    return {**at_scale_view.widget_values(spec, "", tiny=False), "at_scale_gpus": 4, **changes}


def test_widget_values_from_a_link_and_the_link_from_widget_values():
    values = _values()
    assert values["at_scale_dtype"] == DEFAULT.dtype  # "auto" is bf16, as on a GPU
    assert values["at_scale_model"] == "qwen3-8b" and values["at_scale_targets_for"] is None
    assert not values["at_scale_tiny"] and values["at_scale_gpu"] == at_scale_view.DEFAULT_GPU
    assert at_scale_view.widget_values(DEFAULT, "my-folder", tiny=True)["at_scale_model"] == LOCAL
    query = at_scale_view.query(values, "qwen3-8b", ("q_proj",))
    assert query == {"model": "qwen3-8b", "seq": "4096", "batch": "2", "dtype": "bfloat16", "gpu": "H100 80 GB",
                     "gpus": "4", "opt": "adamw", "lora": "8", "targets": "q_proj"}  # fmt: skip
    custom = at_scale_view.query(
        _values(at_scale_gpu=CUSTOM, at_scale_budget_gib=24.0, at_scale_lora=False), "m", ("q",)
    )
    assert custom["gpu"] == "24GiB" and custom["lora"] == "off" and "targets" not in custom


def test_the_link_carries_the_selective_policies_and_reads_back_the_ones_the_page_offers():
    with_policies = at_scale_view.query(_values(at_scale_selective=["attention", "matmuls"]), "qwen3-8b", None)
    assert with_policies["selective"] == "attention,matmuls"
    assert "selective" not in at_scale_view.query(_values(), "qwen3-8b", None)  # plain checkpointing alone: no key
    assert at_scale_view.policies_from_link(with_policies["selective"]) == (["attention", "matmuls"], [])
    assert at_scale_view.policies_from_link(" matmuls , nonsense,") == (["matmuls"], ["nonsense"])
    assert at_scale_view.policies_from_link("") == ([], [])
    assert "none" not in at_scale_view.OFFERED_POLICIES and "attention" in at_scale_view.OFFERED_POLICIES


def test_the_request_follows_the_widgets_and_its_problem_is_in_words():
    info = ckptlab.describe("qwen3-8b")
    request = at_scale_view.request_from_widgets(_values(), "qwen3-8b", info.num_layers, None)
    assert (request.seq_len, request.batch_size, request.world_size, request.lora_rank) == (4096, 2, 4, 8)
    assert request.settings == tuple(scale_settings(info.num_layers, "distinct", "n=1"))
    assert "LoRA under FSDP2" in at_scale_view.request_problem(request, info, "en")  # a problem, in words
    assert at_scale_view.request_problem(replace(request, world_size=1), info, "en") == ""


def test_the_plan_line_names_a_long_list_by_its_ends_and_counts_what_is_known():
    request = ScaleRequest(model="m", seq_len=128, batch_size=1, dtype="bfloat16",
                           settings=tuple(scale_settings(36, "all", "none")))  # fmt: skip
    line = at_scale_view.plan_line(request, "all", 36, known=3, lang="en")
    assert line.startswith(f"**{len(request.settings)} simulations**: off, n=1, n=2, n=3, …,")
    assert line.endswith(i18n.t("at_scale.plan_known", "en", known=3))
    short = replace(request, settings=request.settings[:2])
    assert "…" not in at_scale_view.plan_line(short, "distinct", 36, known=0, lang="en")


def test_progress_words_and_the_changed_line():
    from ckptlab.fact import Fact
    from ckptlab.step.stopping import DONE

    done = Fact("progress.prefixed", {"prefix": Fact("progress.label", {"label": "n=2"}), "message": DONE})
    assert at_scale_view.progress_words(2, 5, done, False, "en") == "Simulating (2 of 5 done): n=2: done"
    assert at_scale_view.progress_words(2, None, DONE, False, "en") == i18n.t(
        "at_scale.searching", "en", done=2, message="done"
    )
    assert at_scale_view.progress_words(2, 5, done, True, "en") == i18n.t("at_scale.stopping", "en")
    shown = ScaleRequest(model="m", seq_len=8192, batch_size=1, dtype="bfloat16", settings=(), world_size=8)
    assert "seq 8,192" in at_scale_view.changed_line(shown, "en") and "8 GPUs" in at_scale_view.changed_line(
        shown, "en"
    )


def test_the_progress_line_is_said_in_the_pages_language():
    from ckptlab.step.stopping import DONE, label, prefixed

    line = at_scale_view.progress_words(2, 5, prefixed(label("n=2"), DONE), False, "ja")
    assert line == i18n.t("at_scale.progress", "ja", done=2, total=5, message="n=2: 完了")
    assert (
        at_scale_view.progress_words(2, 5, prefixed(label("n=2"), DONE), False, "en")
        == "Simulating (2 of 5 done): n=2: done"
    )


def test_the_table_is_as_tall_as_its_rows_up_to_a_limit():
    assert at_scale_view.table_height(1) == 2 * at_scale_view.TABLE_ROW_PX + 4  # a row and the header
    assert at_scale_view.table_height(10) > at_scale_view.table_height(9)
    assert at_scale_view.table_height(500) == at_scale_view.TABLE_MAX_PX  # past it the table scrolls inside


def test_the_peak_header_is_per_gpu_past_one_and_the_launch_lines_name_ckptlabs():
    assert at_scale_view.peak_header(1, "en") == i18n.t("at_scale.peak_header", "en")
    assert at_scale_view.peak_header(4, "en") == i18n.t("at_scale.peak_header_gpus", "en", gpus=4)
    code = SearchCode("torchrun --nproc-per-node 4 train.py", "python -m ckptlab run ...", "", "")
    assert at_scale_view.launch_code(code, "ja").splitlines() == [
        "torchrun --nproc-per-node 4 train.py",
        "",
        f"# {i18n.t('at_scale.code_ckptlab', 'ja')}",
        "python -m ckptlab run ...",
    ]


def test_the_verdict_says_when_only_checkpointing_every_layer_fits():
    """Not "it reruns the fewest layers (6 of 6)": the one fitting setting reruns them all, and the verdict says so."""
    from ckptlab.explore.scale import scale_table
    from ckptlab.results import memory_of
    from ckptlab.spec import Setting

    settings = (Setting(None, False), Setting(2, False), Setting(1, False))
    table = scale_table("tiny-llama", 1024, 4, "bfloat16", settings)
    peaks = {Setting.of(result.spec): memory_of(result).peak_bytes for result in table.results}
    assert peaks[Setting(1, False)] < min(peaks[Setting(2, False)], peaks[Setting(None, False)])
    budget = (peaks[Setting(1, False)] + min(peaks[Setting(2, False)], peaks[Setting(None, False)])) // 2
    answer = at_scale_view.verdict(table, budget, "the test's budget", "en")
    assert answer.kind == "success" and "all 6 layers rerun" in answer.text and "fewest" not in answer.text
    budget = peaks[Setting(2, False)] + 1  # now every_n_layers=2 fits too: it reruns fewer
    answer = at_scale_view.verdict(table, budget, "the test's budget", "en")
    assert "reruns the fewest layers (3 of 6)" in answer.text


def test_the_verdict_names_every_setting_that_fits_and_the_precision_it_assumed():
    """Not "the only setting that fits" beside a table where another fits too; and the dtype it assumed, since
    Trainer's usual bf16=True on float32 weights needs far more."""
    from ckptlab.explore.scale import scale_table
    from ckptlab.results import memory_of
    from ckptlab.spec import Setting

    settings = (Setting(None, False), Setting(2, False), Setting(1, False))
    table = scale_table("tiny-llama", 1024, 4, "bfloat16", settings)
    peaks = {Setting.of(result.spec): memory_of(result).peak_bytes for result in table.results}
    answer = at_scale_view.verdict(table, peaks[Setting(2, False)] + 1, "the test's budget", "en")
    assert "Every setting simulated that fits: n=2, n=1." in answer.text
    assert "Assumed: bfloat16 weights" in answer.text and "`bf16=True` keeps float32 weights" in answer.text
    lonely = at_scale_view.verdict(table, peaks[Setting(1, False)] + 1, "the test's budget", "en")
    assert "Every setting simulated that fits" not in lonely.text and "only" not in lonely.text
    assert at_scale_view.float32_under_mixed({"at_scale_dtype": "bfloat16", "at_scale_mixed_precision": "none"})
    assert not at_scale_view.float32_under_mixed({"at_scale_dtype": "float32", "at_scale_mixed_precision": "bf16"})


def test_with_lora_the_precision_assumed_is_the_adapters_float32():
    """Issue 58: QLoRA's verdict said "Assumed: bfloat16 weights, so bfloat16 gradients and optimizer state", but the
    adapters, their gradients and AdamW's state are float32 (peft), and only the base is 4-bit."""
    qlora = RunSpec(model="qwen3-8b", dtype="bfloat16", lora_rank=8, quantization=ckptlab.QLORA)
    said = at_scale_view.precision(qlora, "en")
    assert "bfloat16 gradients" not in said and "4-bit base (nf4) computing in bfloat16" in said
    assert "LoRA adapters that train, their gradients and optimizer state in float32" in said
    lora = at_scale_view.precision(replace(qlora, quantization=None, mixed_precision="bf16", dtype="float32"), "pt-BR")
    assert "base congelada em float32" in lora and lora.endswith("Precisão mista bf16 do Trainer no cálculo.")
    assert at_scale_view.precision(RunSpec(dtype="bfloat16"), "en").startswith(
        " Assumed: bfloat16 weights, so bfloat16"
    )


def test_the_trainer_code_names_the_versions_installed():
    import accelerate
    import transformers

    versions = at_scale_view.trainer_versions()
    assert versions == {"transformers": transformers.__version__, "accelerate": accelerate.__version__}
    assert f"accelerate {accelerate.__version__}" in i18n.t("at_scale.code_trainer", "en", **versions)


def test_a_4_bit_base_reaches_the_request_and_the_link_and_the_gpu_search_says_it_is_one_gpu():
    """QLoRA (issue 46): the toggle's 4-bit base is in the request's specs and the link; past one GPU the page says
    why not (FSDP2 over a 4-bit base is not simulated), and the GPU search looks at one GPU and says so."""
    from ckptlab.explore.gpu_search import GpuSearch, searched_counts

    info = ckptlab.describe("qwen3-8b")
    values = _values(at_scale_qlora=True)
    request = at_scale_view.request_from_widgets(values, "qwen3-8b", info.num_layers, None)
    assert request.spec(request.settings[0]).quantization == ckptlab.QLORA
    assert at_scale_view.query(values, "qwen3-8b", None)["qlora"] == "1"
    assert "runs on one GPU" in at_scale_view.request_problem(request, info, "en")
    one = replace(request, world_size=1)
    assert at_scale_view.request_problem(one, info, "en") == ""
    assert searched_counts(one, (1, 2, 4)) == (1,) and searched_counts(replace(one, quantization=None), (1, 2)) == (
        1,
        2,
    )
    search = GpuSearch(one, 24 * GIB, (1,), info.num_layers, None, quantized_one_gpu=True)
    assert at_scale_view.search_verdict(search, "24 GiB", "en").text.startswith(
        "A 4-bit base (QLoRA) is searched on one"
    )


def test_the_longest_sequence_searches_the_ends_and_says_when_nothing_fits_in_the_pages_language():
    from ckptlab.explore.longest import LongestSeq, LongestTable

    settings = tuple(scale_settings(36, "distinct", "n=1", policies=("attention",)))
    request = ScaleRequest("qwen3-8b", 8192, 1, "bfloat16", settings)
    searched = at_scale_view.longest_settings(request)
    assert [setting.key for setting in searched] == ["off", "n=1", "n=1+attention", "n=1+offload"]
    rows = tuple(LongestSeq(setting.key, 0, None, 16, 30 * GIB + index, 24 * GIB, 3, 40960)
                 for index, setting in enumerate(searched))  # fmt: skip
    found = LongestTable(request, 24 * GIB, rows, searched, False, 12.0, 12)
    assert at_scale_view.longest_is_for(found, replace(request, seq_len=1024), 24 * GIB)  # the first guess aside
    assert not at_scale_view.longest_is_for(found, request, 80 * GIB)
    assert not at_scale_view.longest_is_for(found, replace(request, lora_rank=8), 24 * GIB)
    verdict = at_scale_view.longest_verdict(found, 24 * GIB, "RTX 4090 24 GB", "en")
    assert verdict.kind == "error" and "Not even 16 tokens fit RTX 4090 24 GB" in verdict.text
    assert "30.00 GiB (**off**)" in verdict.text
    assert (
        "24 GiB" in at_scale_view.longest_verdict(found, 80 * GIB, "H100 80 GB", "en").text
    )  # the search's own budget
    assert "16 トークンすら" in at_scale_view.longest_verdict(found, 24 * GIB, "RTX 4090 24 GB", "ja").text
    assert "configurações procuradas" in at_scale_view.longest_summary(found, "pt-BR")


def test_the_longest_sequence_table_shows_the_bytes_either_side_in_one_number_format():
    """Issue 58: the answer and the next length both read "24" GiB, so the table could not show why 8,392 fits and
    8,393 does not, and it mixed "1417" with "1,418". The bytes to spare and over, and every number in the page's
    form."""
    from ckptlab.explore.longest import LongestSeq, LongestTable

    request = ScaleRequest("qwen3-8b", 8192, 1, "bfloat16", tuple(scale_settings(36, "distinct", "n=1")))
    budget = 24 * GIB
    rows = (
        LongestSeq("n=1", 8392, budget - 1_500_000, 8393, budget + 700_000, budget, 4, 40960),
        LongestSeq("off", 1417, budget - 3, 1418, budget + 2_000_000, budget, 12, 40960),
    )
    found = LongestTable(request, budget, rows, at_scale_view.longest_settings(request)[:2], False, 3.0, 16)
    every = at_scale_view.longest_rows(found, "pt-BR")[0]
    assert list(every.values()) == ["n=1", "8.392", "24,00", "1.500.000", "8.393", "24,00", "700.000", "4"]
    english = at_scale_view.longest_rows(found, "en")[1]
    assert english["longest seq_len that fits"] == "1,417" and english["shortest that does not fit"] == "1,418"
    assert english["to spare, bytes"] == "3" and english["over by, bytes"] == "2,000,000"


def test_the_time_beside_the_memory_in_the_verdict_the_table_and_the_code_box():
    """Issue 59's faces at scale: the verdict picks the fastest predicted setting that fits and says its step time
    and factor over off, labelled predicted (roofline, GPU); the table has the time column and the factor; the code
    box's first line says the predicted step time; a custom budget says whose speed the times are on."""
    from ckptlab.explore.gpus import GPU_SPECS
    from ckptlab.explore.scale import table_times
    from ckptlab.spec import Setting
    from tests.explore import hand_table

    table = hand_table.table(hand_table.PEAKS)
    h100 = at_scale_view.time_gpu("H100 80 GB")
    assert at_scale_view.time_gpu(CUSTOM) is GPU_SPECS[at_scale_view.TIME_GPU_FOR_CUSTOM]
    assert at_scale_view.time_gpu("A100 40 GB") is GPU_SPECS["A100 40 GB"]
    answer = at_scale_view.verdict(table, hand_table.BUDGET, "a budget", "en", h100)
    assert answer.text.startswith("1 GPU: **n=1** fits a budget") and "shortest predicted step" in answer.text
    assert "×1.33 the step with checkpointing off, predicted (roofline, H100 80 GB)" in answer.text
    by_recompute = at_scale_view.verdict(table, hand_table.BUDGET, "a budget", "en")  # no GPU speed: as before
    assert "**n=2+offload**" in by_recompute.text and "predicted" not in by_recompute.text
    assert "Tempo do passo" in at_scale_view.verdict(table, hand_table.BUDGET, "x", "pt-BR", h100).text

    rows = at_scale_view.rows(table, hand_table.BUDGET, "a budget", "en", h100)
    column = "step, ms: predicted (roofline, H100 80 GB)"
    times = {row.setting.key: row.prediction.seconds for row in table_times(table, h100)}
    assert [row[column] for row in rows] == [round(times[row["setting"]] * 1000, 1) for row in rows]
    assert [row["× off's step"] for row in rows][:1] == [1.0] and rows[3]["× off's step"] == 1.33
    assert column not in at_scale_view.rows(table, hand_table.BUDGET, "a budget", "en")[0]  # no speed, no column
    assert (
        "H100 80 GB" in at_scale_view.time_gpu_caption(CUSTOM, "ja")
        and at_scale_view.time_gpu_caption("L4 24 GB", "en") == ""
    )

    n1 = next(row for row in table_times(table, h100) if row.setting == Setting(1))
    code = at_scale_view.timed_code("model.activation_checkpointing_enable(every_n_layers=1)", n1, "en")
    ms = i18n.number(n1.prediction.seconds * 1000, ",.1f", "en")
    assert code.splitlines()[0] == f"# Step time predicted (roofline, H100 80 GB): {ms} ms (not measured)"
    assert at_scale_view.timed_code("x = 1", None, "en") == "x = 1"

    from ckptlab.explore.gpu_search import GpuSearch

    answer_n1 = next(result for result in table.results if Setting.of(result.spec) == Setting(1))
    search = GpuSearch(table.request, hand_table.BUDGET, (1,), hand_table.LAYERS, answer_n1, list(table.results))
    said = at_scale_view.search_verdict(search, "a budget", "en", h100).text
    assert f"Step time: {ms} ms, ×1.33 the step with checkpointing off, predicted (roofline, H100 80 GB)." in said
