"""A model by its Hub name: its config.json alone, fetched through huggingface_hub from a local stand-in of the Hub
(tests/model/hubserver.py); no test touches the real Hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from transformers import AutoConfig

from ckptlab import RunSpec, measure
from ckptlab.cli import main
from ckptlab.errors import CkptlabError
from ckptlab.lab.server import ServerPolicy
from ckptlab.model import hub
from ckptlab.model.catalog import describe
from ckptlab.model.configs import load_config
from ckptlab.model.presets import PRESETS
from tests.model.hubserver import (
    ANNOUNCED,
    DRIP,
    GATED,
    GZIP,
    HUGE,
    MISMATCH,
    MUTE,
    NO_CONFIG,
    RESET,
    SHORT,
    SILENT,
    STREAM,
    TAG,
    TOKEN,
    fake_hub,
)

ROOT = Path(__file__).resolve().parents[2]
REMOTE_CODE = json.dumps({"model_type": "my_own_llm", "auto_map": {"AutoConfig": "modeling_mine.MyConfig"}})


def preset_config_json(name: str) -> bytes:
    """The config.json ``save_pretrained()`` writes for preset ``name``: what its Hub repository would hold."""
    values = dict(PRESETS[name].config)
    return AutoConfig.for_model(values.pop("model_type"), **values).to_json_string().encode()


CONFIGS = {
    "lab/tiny-llama": preset_config_json("tiny-llama"),
    GATED: preset_config_json("tiny-llama"),
    "lab/custom": REMOTE_CODE.encode(),
    "lab/not-json": b"{ this is not JSON",
}


@pytest.fixture
def served():
    with fake_hub(CONFIGS) as server:  # a server of the test's own starts in milliseconds
        yield server


@pytest.fixture
def access(served, tmp_path):
    """This process reaches the stand-in, with an empty cache of the test's own and a short deadline."""
    chosen = hub.HubAccess(endpoint=served.url, cache_dir=str(tmp_path / "hub"), token=False, deadline_s=20.0)
    hub.configure(chosen)
    return chosen


def _error(name: str) -> CkptlabError:
    with pytest.raises(CkptlabError) as caught:
        describe(name)
    return caught.value


def test_a_hub_name_is_described_from_its_config_alone_as_the_preset_it_copies(access, served):
    before = len(served.requests)
    info = describe("lab/tiny-llama")
    preset = describe("tiny-llama")
    assert (info.source, info.weights, info.name) == ("hub", "random", "lab/tiny-llama")
    assert {**info.to_dict(), "name": "tiny-llama", "source": "preset"} == preset.to_dict()
    asked = {path.split("/")[-1] for _, path, _ in served.requests[before:]}
    assert asked == {"config.json"}  # never a weight, an index or code
    assert describe(f"lab/tiny-llama@{TAG}").num_params == info.num_params  # a revision: owner/name@revision


@pytest.mark.parametrize(
    ("name", "key", "words"),
    [
        ("lab/missing", "hub.not_found", "neither a preset nor a folder here, and the Hugging Face Hub has no"),
        (GATED, "hub.gated", "gated repository"),
        (HUGE, "hub.config_too_large", "64.0 MiB"),
        (NO_CONFIG, "hub.no_config", "has no config.json"),
        ("lab/custom", "model.remote_code", "'lab/custom' has model_type 'my_own_llm', which needs the model's own"),
        ("lab/not-json", "folder.not_json", "could not be read as JSON"),
        ("lab/tiny-llama@no-such-branch", "hub.no_revision", "no revision 'no-such-branch'"),
    ],
)
def test_each_way_a_fetch_fails_is_one_line_naming_the_repository(access, name, key, words):
    error = _error(name)
    assert error.key == key
    assert words in str(error) and "\n" not in str(error)
    if key != "folder.not_json":  # that one names the cached file, whose path holds the repository
        assert name.split("@")[0] in str(error)


def test_a_gated_repository_opens_with_a_token(access):
    hub.configure(hub.HubAccess(**{**_fields(access), "token": TOKEN}))
    assert describe(GATED).source == "hub"


def test_a_hub_that_never_answers_ends_at_the_labs_own_deadline(access):
    hub.configure(hub.HubAccess(**{**_fields(access), "deadline_s": 0.3}))
    error = _error(SILENT)
    assert error.key == "hub.timeout" and "0.3 s" in str(error)


@pytest.mark.parametrize(
    ("name", "hub_name"),
    [
        ("Qwen/Qwen3-8B", True),
        ("meta-llama/Llama-3.1-8B@main", True),
        ("owner/name@refs/pr/1", True),
        ("owner/name@../../elsewhere", False),  # a revision that would climb out of the cache's refs/
        ("owner/name@", False),
        ("owner/name@.", False),  # "." is dropped from the resolve URL: the Hub would be asked another path
        ("./owner/name", False),
        ("~/owner/name", False),
        ("/owner/name", False),
        ("owner/name/sub", False),
        ("owner--x/name", False),
        ("tiny-llama", False),
    ],
)
def test_which_names_read_as_a_hub_repository(name, hub_name):
    assert hub.is_repo_name(name) is hub_name


def test_no_network_and_nothing_cached_is_said_at_once_not_after_huggingface_hubs_retries(tmp_path):
    # A port nothing listens on; huggingface_hub's own retries with backoff would take 23 s, past the deadline.
    hub.configure(hub.HubAccess(endpoint="http://127.0.0.1:9", cache_dir=str(tmp_path), token=False, deadline_s=8))
    error = _error("lab/anything")
    assert error.key == "hub.unreachable" and "not in the cache" in str(error)


def test_a_name_written_as_a_path_never_goes_to_the_hub_and_a_folder_wins_over_a_repository(
    access, served, tmp_path, monkeypatch
):
    before = len(served.requests)
    for name in ("./lab/tiny-llama", "/lab/tiny-llama", "~/lab/tiny-llama", "../lab/tiny-llama"):
        assert _error(name).key == "model.not_found", name
    assert _error("tiny-lama").key == "model.not_found"  # a preset's typo is not an owner/name
    folder = tmp_path / "lab" / "tiny-llama"
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(preset_config_json("tiny-qwen3"))
    monkeypatch.chdir(tmp_path)
    assert describe("lab/tiny-llama").source == "local"  # the folder here, not the repository
    assert len(served.requests) == before


@pytest.mark.slow  # a subprocess, a simulation, a real step
def test_the_pre_filled_cache_answers_with_hf_hub_offline(access, tmp_path):
    describe("lab/tiny-llama")  # fills the cache
    # HF_HUB_OFFLINE and HF_ENDPOINT are read when huggingface_hub is imported: a fresh interpreter, whose
    # endpoint is a port nothing listens on, so nothing could be fetched even if it tried.
    probe = (
        "from ckptlab.model import hub\n"
        "print(hub.config_file('lab/tiny-llama'))\n"
        "try:\n    hub.config_file('lab/never-fetched')\nexcept Exception as error:\n    print(error.key)\n"
    )
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": access.cache_dir,
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=environment, timeout=120, check=False
    )
    cached, missing = done.stdout.split()
    assert cached.startswith(access.cache_dir) and cached.endswith("config.json"), done.stderr
    assert missing == "hub.unreachable"


@pytest.mark.slow  # a subprocess, a simulation, a real step
def test_the_command_line_takes_a_hub_name_and_a_revision(access, capsys):
    argv = ["simulate", "--model", "lab/tiny-llama", "--revision", TAG, "--seq-len", "64", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["spec"]["model"] == data["model"]["name"] == f"lab/tiny-llama@{TAG}"
    assert main(["simulate", "--model", "tiny-llama", "--revision", TAG]) == 2
    assert "--revision 'v1' names a revision of a Hugging Face Hub repository" in capsys.readouterr().err
    assert main(["simulate", "--model", "lab/missing"]) == 2  # one line, saying both were tried
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and "neither a preset nor a folder here, and the Hugging Face Hub has no" in said


@pytest.mark.slow  # a subprocess, a simulation, a real step
def test_a_measured_run_of_a_hub_model_builds_it_with_random_weights(access):
    result = measure(RunSpec(model="lab/tiny-llama", seq_len=32, repeats=1, warmup=0, optimizer="none"))
    assert result.status == "ok" and result.model.name == "lab/tiny-llama" and result.model.weights == "random"


def test_a_shared_server_fetches_only_when_the_instructor_says_and_sends_no_token_of_its_own(access):
    off = ServerPolicy.from_settings({})
    assert not off.hub and off.hub_access().token is False
    hub.configure(hub.HubAccess(**{**_fields(off.hub_access()), "endpoint": access.endpoint}))
    assert _error("lab/tiny-llama").key == "hub.off"
    on = ServerPolicy.from_settings({"CKPTLAB_HUB": "1", "CKPTLAB_HUB_CACHE": access.cache_dir})
    hub.configure(hub.HubAccess(**{**_fields(on.hub_access()), "endpoint": access.endpoint}))
    assert describe("lab/tiny-llama").source == "hub"
    assert _error(GATED).key == "hub.gated_server"  # no token sent, and the message says so
    given = ServerPolicy.from_settings({"CKPTLAB_HUB": "1", "CKPTLAB_HUB_TOKEN": TOKEN})
    assert given.hub_access().token == TOKEN and TOKEN not in repr(given) + repr(given.hub_access())
    with pytest.raises(CkptlabError) as caught:
        ServerPolicy.from_settings({"CKPTLAB_HUB": "yes"})
    assert caught.value.key == "server.hub"


def _fields(access: hub.HubAccess) -> dict:
    return {name: getattr(access, name) for name in access.__dataclass_fields__}


@pytest.mark.slow
def test_simulating_a_served_copy_of_a_preset_equals_simulating_the_preset_to_the_byte(served, tmp_path, capsys):
    hub.configure(hub.HubAccess(endpoint=served.url, cache_dir=str(tmp_path), token=False))
    served.configs["lab/llama-3.1-8b"] = preset_config_json("llama-3.1-8b")
    outputs = []
    for model in ("llama-3.1-8b", "lab/llama-3.1-8b"):
        assert main(["simulate", "--model", model, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        # What names the model and when it ran differ by design; every other byte must not.
        assert data["spec"].pop("model") == data["model"].pop("name") == model
        data["provenance"].pop("created_at")
        outputs.append(json.dumps(data))
    assert outputs[0] == outputs[1]


def test_the_pages_hub_entry_takes_only_an_owner_name_and_a_link_restores_it(tmp_path, monkeypatch):
    from ckptlab.lab import at_scale_view, lab_view
    from ckptlab.lab.modelbox import HUB, hub_name_problem
    from ckptlab.show import i18n

    spec = RunSpec(model="Qwen/Qwen3-8B")
    assert at_scale_view.widget_values(spec, "", tiny=False, hub_name=spec.model)["at_scale_model"] == HUB
    values = lab_view.widget_values(spec, "", hub_name=spec.model)
    assert (values["lab_model"], values["lab_hub_name"]) == (HUB, "Qwen/Qwen3-8B")
    assert hub_name_problem("Qwen/Qwen3-8B@main", "en") == ""
    (tmp_path / "srv" / "secrets").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    # The box must not open, by another name, a folder the instructor does not offer.
    for name in ("/etc", "../x/y", "~/models", "srv/secrets", "Qwen/Qwen3 8B"):  # shown as text, not Markdown
        assert repr(i18n.Literal(name)) in hub_name_problem(name, "en"), name


@pytest.mark.slow  # the app
@pytest.mark.parametrize(("page", "prefix"), [("at_scale.py", "at_scale"), ("lab.py", "lab")])
def test_a_page_opens_a_link_to_a_hub_model_only_where_the_instructor_allows_it(
    page, prefix, served, tmp_path, monkeypatch
):
    from streamlit.testing.v1 import AppTest

    from ckptlab.lab import server

    real = server.ServerPolicy.hub_access
    # The server's own way to the Hub, pointed at the stand-in (huggingface_hub read HF_ENDPOINT at import).
    monkeypatch.setattr(server.ServerPolicy, "hub_access", lambda self: _at(real(self), served.url))
    monkeypatch.setenv("CKPTLAB_WORKERS", "thread")
    monkeypatch.setenv("CKPTLAB_HUB_CACHE", str(tmp_path))
    pages = {}
    for allowed in ("1", "0"):
        monkeypatch.setenv("CKPTLAB_HUB", allowed)
        at = AppTest.from_file(str(ROOT / "pages" / page), default_timeout=60)
        at.query_params.update(model="lab/tiny-llama", seq="128")
        pages[allowed] = at.run()
        assert not pages[allowed].exception, pages[allowed].exception
    on, off = pages["1"], pages["0"]
    box = f"{prefix}_model"
    assert on.selectbox(key=box).value == "hub"
    assert on.text_input(key=f"{prefix}_hub_name").value == "lab/tiny-llama"
    assert not on.error, [error.value for error in on.error]  # described from the served config
    assert any(path.endswith("/lab/tiny-llama/resolve/main/config.json") for _, path, _ in served.requests)
    assert off.selectbox(key=box).value != "hub" and "hub" not in off.selectbox(key=box).options
    assert any("lab/tiny-llama" in str(warning.value) for warning in off.warning)


def _at(access: hub.HubAccess, endpoint: str) -> hub.HubAccess:
    return hub.HubAccess(**{**_fields(access), "endpoint": endpoint})


def test_a_config_is_fetched_once_per_process_and_a_silent_hub_leaves_the_cache_answering_at_once(access, served):
    before = len(served.requests)
    # What one simulate asks (describe's stamp and description, the checks' and the step's load_config): one fetch.
    describe("lab/tiny-llama")
    load_config("lab/tiny-llama")
    path = hub.config_file("lab/tiny-llama")
    assert [method for method, _, _ in served.requests[before:]] == ["HEAD", "GET"]
    # Another way to the Hub (as a fresh process would fetch again) over the warm cache, the Hub now silent: its
    # one HEAD waits cached_head_s, not a HEAD's 10 s per fetch, and the cached copy answers every caller.
    served.silent.set()
    # (The endpoint written with a trailing "/": the same server, another way to it, so nothing fetched is known.)
    again = {"endpoint": f"{served.url}/", "cached_head_s": 0.2, "deadline_s": 30.0}
    hub.configure(hub.HubAccess(**{**_fields(access), **again}))
    before = len(served.requests)
    assert [hub.config_file("lab/tiny-llama") for _ in range(3)] == [path] * 3
    assert load_config("lab/tiny-llama")[1] == "hub"
    assert [method for method, _, _ in served.requests[before:]] == ["HEAD"]


def _no_partial_file(access) -> None:
    left = [path.name for path in Path(access.cache_dir).rglob("*") if path.is_file()]
    assert not [name for name in left if name.endswith(".incomplete")] and not any("blobs" in name for name in left)
    assert not list(Path(access.cache_dir).rglob("blobs/*")), left


def test_a_transfer_stops_at_the_size_the_head_announced_and_keeps_nothing(access, served):
    error = _error(STREAM)  # bytes forever, no Content-Length; the HEAD said ANNOUNCED
    assert error.key == "hub.overlong" and f"{ANNOUNCED:,} bytes" in str(error)
    _no_partial_file(access)


def test_a_transfer_stops_at_the_deadline_and_keeps_nothing(access, served):
    hub.configure(hub.HubAccess(**{**_fields(access), "deadline_s": 0.3}))
    assert _error(DRIP).key == "hub.timeout"  # a byte every 10 ms: ANNOUNCED bytes take 1 s
    assert served.ended.wait(10)  # the server saw the client leave, rather than send the whole body
    assert served.sent[DRIP] < ANNOUNCED
    for thread in threading.enumerate():  # the fetch's thread ends too (it removes its partial file first)
        if thread.name == hub.FETCH_THREAD:
            thread.join(10)
    _no_partial_file(access)
    assert _error(MUTE).key == "hub.timeout"  # headers, then nothing: the read ends at the deadline as well


@pytest.mark.parametrize("repo", [RESET, SHORT, MISMATCH, GZIP])
def test_every_transport_error_is_one_line_naming_the_repository(access, repo):
    error = _error(repo)
    assert error.key in ("hub.transfer", "hub.short", "hub.overlong"), error.key
    assert repo in str(error) and "\n" not in str(error)
    _no_partial_file(access)


def test_the_servers_hub_cache_is_bounded_by_bytes_the_oldest_revision_evicted(served, tmp_path):
    size = len(CONFIGS["lab/tiny-llama"])
    served.configs.update({f"lab/copy-{i}": CONFIGS["lab/tiny-llama"] for i in range(3)})
    policy = ServerPolicy.from_settings({"CKPTLAB_HUB": "1", "CKPTLAB_HUB_CACHE": str(tmp_path)})
    assert policy.hub_access().cache_max_bytes == 64 * 2**20  # the default bound (docs/workshop-server.md)
    bound = int(2.5 * size)  # room for two copies
    mib = bound / 2**20
    policy = ServerPolicy.from_settings(
        {"CKPTLAB_HUB": "1", "CKPTLAB_HUB_CACHE": str(tmp_path), "CKPTLAB_HUB_CACHE_MIB": mib}
    )
    hub.configure(hub.HubAccess(**{**_fields(policy.hub_access()), "endpoint": served.url}))
    paths = [hub.config_file(f"lab/copy-{i}") for i in range(3)]
    kept = [os.path.exists(path) for path in paths]
    assert kept == [False, True, True]
    held = sum(path.stat().st_size for path in tmp_path.rglob("blobs/*"))
    assert held <= bound
    assert os.path.exists(hub.config_file("lab/copy-0"))  # evicted, so fetched again
    with pytest.raises(CkptlabError) as caught:
        ServerPolicy.from_settings({"CKPTLAB_HUB_CACHE_MIB": "0"})
    assert caught.value.key == "server.hub_cache_mib"


@pytest.mark.parametrize(
    ("name", "revision"), [("lab/tiny-llama", "../x"), ("lab/tiny-llama", ""), ("t/anyrev-ok", ".")]
)
def test_a_bad_revision_is_refused_naming_the_revision_not_the_repository(access, served, name, revision):
    before = len(served.requests)
    with pytest.raises(CkptlabError) as caught:
        describe(hub.with_revision(name, revision) if revision != "." else f"{name}@{revision}")
    error = caught.value
    assert error.key == "hub.bad_revision" and f"{revision!r} is not a revision" in str(error), str(error)
    assert len(served.requests) == before  # nothing asked of the Hub
