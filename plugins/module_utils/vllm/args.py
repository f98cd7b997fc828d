# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM service's command line, environment and install identity, from the vllm_service
role's variables. Pure functions, no I/O.

build(params) checks every flag value and returns the argv list (never a shell string), the
systemd ExecStart line, the EnvironmentFile text and the venv name. Every error is a
VllmArgsError naming the role variable, the value, why, and what is accepted. The API key never
enters the argv: vLLM reads it from VLLM_API_KEY, which the role writes to a root-only file.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import posixpath
import re

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# vLLM 0.32's choices (vllm/config/cache.py CacheDType, vllm/model_executor/layers/quantization
# QuantizationMethods, ModelConfig dtype). A newer vLLM's value can be passed through
# vllm_service_extra_args while the variable is left unset.
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
                   "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
                   "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6")
QUANTIZATIONS = ("awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
                 "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
                 "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8",
                 "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only",
                 "nvfp4_per_token", "mxfp8", "bitsandbytes", "gguf")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

# role variable (without the vllm_service_ prefix) -> the flags it owns
MANAGED_FLAGS = {
    "model": ("--model",),
    "served_model_name": ("--served-model-name",),
    "host": ("--host",),
    "port": ("--port",),
    "tensor_parallel_size": ("--tensor-parallel-size", "-tp"),
    "pipeline_parallel_size": ("--pipeline-parallel-size", "-pp"),
    "gpu_memory_utilization": ("--gpu-memory-utilization",),
    "max_model_len": ("--max-model-len",),
    "max_num_seqs": ("--max-num-seqs",),
    "max_num_batched_tokens": ("--max-num-batched-tokens",),
    "enable_chunked_prefill": ("--enable-chunked-prefill", "--no-enable-chunked-prefill"),
    "enable_prefix_caching": ("--enable-prefix-caching", "--no-enable-prefix-caching"),
    "kv_cache_dtype": ("--kv-cache-dtype",),
    "quantization": ("--quantization", "-q"),
    "dtype": ("--dtype",),
}
SECRET_FLAGS = ("--api-key", "--hf-token")
# What to do instead of each secret flag: the role passes the secret through its root-only EnvironmentFile.
SECRET_FLAG_FIX = {
    "--api-key": "set vllm_service_api_key (from Ansible Vault) and the role passes it through a root-only "
                 "EnvironmentFile as VLLM_API_KEY",
    "--hf-token": "set HF_TOKEN in vllm_service_secret_env (from Ansible Vault), which the role keeps in a root-only "
                  "EnvironmentFile (0600) that vLLM reads",
}

DEFAULTS = {
    "model": None,
    "model_is_path": True,
    "served_model_name": "",
    "host": "127.0.0.1",
    "port": 8000,
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "gpu_memory_utilization": 0.9,
    "max_model_len": 0,
    "max_num_seqs": 0,
    "max_num_batched_tokens": 0,
    "enable_chunked_prefill": None,
    "enable_prefix_caching": None,
    "kv_cache_dtype": "auto",
    "quantization": "",
    "dtype": "auto",
    "extra_args": [],
    "command": [],
    "python": "/opt/gpufleet/vllm/current/bin/python",
    "env": {},
    "hf_offline": True,
    "state_dir": "/var/lib/vllm",
    "api_key": "",
    "allow_no_api_key": False,
    "secret_env": {},
    "unit_settings": {},
}

# [Service] settings the role writes itself; vllm_service_unit_settings may not set them.
UNIT_OWNED = ("User", "Group", "ExecStart", "ExecStartPre", "ExecStartPost", "EnvironmentFile", "Environment", "Type",
              "WorkingDirectory", "Restart", "RestartSec", "LimitNOFILE", "LimitMEMLOCK", "TimeoutStopSec",
              "SupplementaryGroups", "ReadWritePaths", "ProtectHome")

# The variables whose value means "leave vLLM's default" (and lets extra_args carry the flag).
UNSET = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "gpu_memory_utilization": 0.9,
         "max_model_len": 0, "max_num_seqs": 0, "max_num_batched_tokens": 0, "enable_chunked_prefill": None,
         "enable_prefix_caching": None, "kv_cache_dtype": "auto", "quantization": "", "dtype": "auto"}

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_API_KEY = re.compile(r"[A-Za-z0-9._~+/=-]+")
# Names that hold credentials (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, AWS_SECRET_ACCESS_KEY, WANDB_API_KEY, ...):
# refused in the plain, world-readable vllm_service_env.
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY|AUTH)", re.IGNORECASE)
# ... and names with a word (between underscores) that names one: OPENAI_KEY, S3_KEY, MY_PASS, SIGNING_KEY, DATABASE_URL.
SECRET_WORDS = {"KEY", "KEYS", "PASS", "PWD", "DSN", "COOKIE", "SIGNATURE", "CERT"}
SECRET_NAMES = {"DATABASE_URL", "DB_URL", "REDIS_URL", "MONGODB_URI", "MONGO_URL", "AMQP_URL", "BROKER_URL", "SENTRY_DSN"}
# Values that are credentials whatever their name: a Hugging Face, OpenAI, GitHub, Slack or AWS token, a private key, a URL
# with a user and password in it.
SECRET_VALUE = re.compile(r"(\bhf_[A-Za-z0-9]{20,}|\bsk-[A-Za-z0-9_-]{20,}|\bgh[pousr]_[A-Za-z0-9]{20,}|\bxox[abpr]-|"
                          r"\bAKIA[0-9A-Z]{16}\b|-----BEGIN|://[^/@\s:]+:[^/@\s]+@)")


class VllmArgsError(ValueError):
    """Invalid vllm_service settings; the message names the variable, the value and what is accepted."""


def _var(name: str) -> str:
    return f"vllm_service_{name}"


def _int(params: dict, name: str, low: int, high: int | None = None) -> int:
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not re.fullmatch(r"\s*\d+\s*", str(value)):
        raise VllmArgsError(f"{_var(name)}={value!r}: expected a whole number{_range(low, high)}")
    number = int(value)
    if number < low or (high is not None and number > high):
        raise VllmArgsError(f"{_var(name)}={number}: outside{_range(low, high)}")
    return number


def _range(low: int, high: int | None) -> str:
    return f" from {low} to {high}" if high is not None else f" of at least {low}"


def _choice(params: dict, name: str, choices) -> str:
    value = params[name]
    if not isinstance(value, str) or value not in choices:
        raise VllmArgsError(f"{_var(name)}={value!r}: expected one of {', '.join(choices)} (vLLM 0.32's values; pass a "
                            f"newer vLLM's value in vllm_service_extra_args and leave {_var(name)} unset)")
    return value


def _tristate(params: dict, name: str):
    value = params[name]
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise VllmArgsError(f"{_var(name)}={value!r}: expected true, false, or null (vLLM's default)")


def _no_control(name: str, value: str) -> None:
    if any(c in value for c in "\n\r\0"):
        raise VllmArgsError(f"{_var(name)}: {value!r} holds a newline or NUL, which a systemd unit cannot carry")


def check_host(value) -> str:
    if not isinstance(value, str) or not value:
        raise VllmArgsError(f"vllm_service_host={value!r}: expected an IP address or a host name")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(value):
        raise VllmArgsError(f"vllm_service_host={value!r}: not an IP address or a valid host name "
                            "(use 127.0.0.1 for local clients only, 0.0.0.0 for every interface)")
    return value


def served_name(params: dict) -> str:
    name = params.get("served_model_name") or ""
    if not name:
        model = str(params["model"]).rstrip("/")
        name = posixpath.basename(model) if params.get("model_is_path", True) else model
    if not _SERVED_NAME.fullmatch(name):
        raise VllmArgsError(f"vllm_service_served_model_name={name!r}: use letters, digits and ._:/@+- (up to 128), "
                            "starting with a letter or digit; clients send it as the model name")
    return name


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0] if arg.startswith("-") else ""


def check_extra_args(params: dict) -> list:
    extra = params["extra_args"]
    scalars = all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in extra) \
        if isinstance(extra, (list, tuple)) else False
    if not scalars:
        raise VllmArgsError(f"vllm_service_extra_args={extra!r}: expected a list of strings, one argv element each "
                            "(['--enforce-eager', '--swap-space', '8'])")
    out = [str(a) for a in extra]
    owner = {flag: var for var, flags in MANAGED_FLAGS.items() for flag in flags}
    for arg in out:
        _no_control("extra_args", arg)
        flag = _flag_name(arg)
        if flag in SECRET_FLAGS:
            raise VllmArgsError(f"vllm_service_extra_args holds {flag}: an argv is visible to every user (ps, "
                                f"/proc/PID/cmdline) and to the journal; {SECRET_FLAG_FIX[flag]}")
        if SECRET_VALUE.search(arg):
            raise VllmArgsError("vllm_service_extra_args holds what looks like a credential (a token or a URL with a "
                                "password; not shown): an argv is visible to every user and to the journal; put it in "
                                "vllm_service_secret_env (from Ansible Vault), which the role keeps in a root-only file")
        var = owner.get(flag)
        if var and params.get(var) != UNSET.get(var, object()):
            raise VllmArgsError(f"vllm_service_extra_args holds {flag}, which vllm_service_{var} sets; set it in one "
                                f"place (vllm_service_{var}, or leave that variable unset and keep the flag here)")
    return out


def check_env(params: dict) -> dict:
    env = params["env"]
    if not isinstance(env, dict):
        raise VllmArgsError(f"vllm_service_env={env!r}: expected a mapping of NAME: value")
    out = {}
    for key in sorted(env, key=str):
        value = env[key]
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise VllmArgsError(f"vllm_service_env: {key!r} is not an environment variable name")
        if key == "VLLM_API_KEY":
            raise VllmArgsError("vllm_service_env holds VLLM_API_KEY: set vllm_service_api_key instead, which the role "
                                "keeps in a root-only file (0600) and out of every log")
        if looks_secret(key, value):
            raise VllmArgsError(f"vllm_service_env.{key} looks like a secret (its value is not shown): vllm_service_env "
                                "goes to a world-readable file and to the role's output. Put it in vllm_service_secret_env "
                                "(from Ansible Vault), which the role keeps in a root-only file (0600) and out of every log")
        if isinstance(value, bool):
            value = "1" if value else "0"
        if value is None or not isinstance(value, (str, int, float)):
            raise VllmArgsError(f"vllm_service_env.{key}={value!r}: expected a string or a number")
        text = str(value)
        if any(c in text for c in "\n\r\0$`\\\""):
            raise VllmArgsError(f"vllm_service_env.{key}={text!r}: newlines, '$', '`', backslashes and double quotes "
                                "are not allowed in a systemd EnvironmentFile value here")
        out[key] = text
    return out


def looks_secret(name: str, value) -> bool:
    """Whether an environment variable holds a credential, by its name (SECRET_NAME, a word of SECRET_WORDS, SECRET_NAMES)
    or by its value (SECRET_VALUE: a token's prefix, a URL with a password)."""
    upper = name.upper()
    if SECRET_NAME.search(upper) or upper in SECRET_NAMES or SECRET_WORDS & set(upper.split("_")):
        return True
    return isinstance(value, str) and bool(SECRET_VALUE.search(value))


def check_api_key(key) -> None:
    """The key itself is never put in a message."""
    if key in (None, ""):
        return
    if not isinstance(key, str):
        raise VllmArgsError("vllm_service_api_key: expected a string (from Ansible Vault)")
    if len(key) < 16:
        raise VllmArgsError(f"vllm_service_api_key: {len(key)} characters is too short; use at least 16 "
                            "(e.g. openssl rand -hex 32)")
    bad = [i for i, c in enumerate(key) if not _API_KEY.fullmatch(c)]
    if bad:
        raise VllmArgsError(f"vllm_service_api_key: the character at position {bad[0] + 1} is outside letters, digits "
                            "and ._~+/=- (the key is not shown)")


def check_secret_env(params: dict) -> list:
    """The names of the secret environment; values are checked but never put in a message or a result."""
    env = params["secret_env"]
    if not isinstance(env, dict):
        raise VllmArgsError("vllm_service_secret_env: expected a mapping of NAME: value (from Ansible Vault)")
    for key in sorted(env, key=str):
        value = env[key]
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise VllmArgsError(f"vllm_service_secret_env: {key!r} is not an environment variable name")
        if key == "VLLM_API_KEY":
            raise VllmArgsError("vllm_service_secret_env holds VLLM_API_KEY: set vllm_service_api_key instead")
        if not isinstance(value, (str, int)) or isinstance(value, bool) or str(value) == "":
            raise VllmArgsError(f"vllm_service_secret_env.{key}: expected a non-empty string (the value is not shown)")
        if any(c in str(value) for c in "\n\r\0$`\\\"' "):
            raise VllmArgsError(f"vllm_service_secret_env.{key}: the value holds a newline, space, quote, '$', '`' or "
                                "backslash, which the EnvironmentFile cannot carry unquoted (the value is not shown)")
    return sorted(env)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def render_secret_envfile(api_key: str, secret_env: dict) -> str:
    """The root-only EnvironmentFile: VLLM_API_KEY and the secret environment (values checked by build())."""
    lines = [f"VLLM_API_KEY={api_key}"] if api_key else []
    lines += [f"{k}={secret_env[k]}" for k in sorted(secret_env)]
    return "\n".join(lines) + "\n" if lines else ""


def check_model(params: dict) -> str:
    model = params["model"]
    if not isinstance(model, str) or not model.strip():
        raise VllmArgsError("vllm_service_model is empty: set it to the model directory on the host "
                            "(e.g. /srv/models/DeepSeek-V3)")
    _no_control("model", model)
    if params.get("model_is_path", True):
        if not model.startswith("/"):
            raise VllmArgsError(f"vllm_service_model={model!r}: expected an absolute path on the host; for a Hugging "
                                "Face hub id set vllm_service_model_is_path: false (and allow the host to reach the hub)")
        return posixpath.normpath(model)
    if not _HUB_ID.fullmatch(model):
        raise VllmArgsError(f"vllm_service_model={model!r}: not a hub id like org/name")
    return model


def check_command(params: dict) -> list:
    command = params["command"]
    if not isinstance(command, (list, tuple)) or not all(isinstance(c, str) for c in command):
        raise VllmArgsError(f"vllm_service_command={command!r}: expected a list of strings (the executable and its own "
                            "arguments), e.g. ['/usr/bin/python3', '/opt/lab/lab_inference_server.py']")
    if not command:
        python = params["python"]
        if not isinstance(python, str) or not python.startswith("/"):
            raise VllmArgsError(f"vllm_service_python={python!r}: expected an absolute path")
        return [python, "-m", API_SERVER_MODULE]
    if not command[0].startswith("/"):
        raise VllmArgsError(f"vllm_service_command[0]={command[0]!r}: systemd needs the executable as an absolute path")
    for arg in command:
        _no_control("command", arg)
        if _flag_name(arg) in SECRET_FLAGS:
            raise VllmArgsError(f"vllm_service_command holds {_flag_name(arg)}; {SECRET_FLAG_FIX[_flag_name(arg)]}")
    return list(command)


def _num(value: float) -> str:
    return repr(float(value)).rstrip("0").rstrip(".") if float(value) != int(value) else str(int(value))


def flags(params: dict) -> list:
    """The serving flags, only those that differ from vLLM's defaults (so a stand-in server that
    knows --host --port --model --served-model-name --max-num-seqs runs with default settings)."""
    p = params
    out = ["--model", check_model(p), "--served-model-name", served_name(p), "--host", check_host(p["host"]),
           "--port", str(_int(p, "port", 1, 65535))]
    tp = _int(p, "tensor_parallel_size", 1, 512)
    if tp != 1:
        out += ["--tensor-parallel-size", str(tp)]
    pp = _int(p, "pipeline_parallel_size", 1, 512)
    if pp != 1:
        out += ["--pipeline-parallel-size", str(pp)]
    util = p["gpu_memory_utilization"]
    try:
        util_f = float(util)
    except (TypeError, ValueError):
        raise VllmArgsError(f"vllm_service_gpu_memory_utilization={util!r}: expected a fraction above 0 and at most 1 "
                            "(0.9 leaves 10% of each GPU's memory to others)") from None
    if isinstance(util, bool) or not 0.0 < util_f <= 1.0:
        raise VllmArgsError(f"vllm_service_gpu_memory_utilization={util!r}: expected a fraction above 0 and at most 1 "
                            "(0.9 leaves 10% of each GPU's memory to others)")
    if util_f != 0.9:
        out += ["--gpu-memory-utilization", _num(util_f)]
    for name, flag, low in (("max_model_len", "--max-model-len", 16), ("max_num_seqs", "--max-num-seqs", 1),
                            ("max_num_batched_tokens", "--max-num-batched-tokens", 16)):
        number = _int(p, name, 0)
        if number:
            if number < low:
                raise VllmArgsError(f"{_var(name)}={number}: use 0 for vLLM's default or at least {low}")
            out += [flag, str(number)]
    for name, flag in (("enable_chunked_prefill", "enable-chunked-prefill"), ("enable_prefix_caching", "enable-prefix-caching")):
        state = _tristate(p, name)
        if state is not None:
            out.append(f"--{flag}" if state else f"--no-{flag}")
    for name, flag, choices in (("kv_cache_dtype", "--kv-cache-dtype", KV_CACHE_DTYPES), ("dtype", "--dtype", DTYPES)):
        value = _choice(p, name, choices)
        if value != "auto":
            out += [flag, value]
    quant = p["quantization"]
    if quant not in ("", None):
        out += ["--quantization", _choice(p, "quantization", QUANTIZATIONS)]
    mnbt = _int(p, "max_num_batched_tokens", 0)
    mml = _int(p, "max_model_len", 0)
    if mnbt and mml and mnbt < mml and _tristate(p, "enable_chunked_prefill") is False:
        raise VllmArgsError(f"vllm_service_max_num_batched_tokens={mnbt} is below vllm_service_max_model_len={mml} with "
                            "chunked prefill off: a long prompt could never be scheduled; raise it or turn chunked "
                            "prefill on")
    return out


def systemd_quote(argv: list) -> str:
    """An ExecStart= value that systemd splits back into exactly ``argv`` (no shell involved):
    specifiers (%) and variable references ($) are escaped, words with spaces or quotes are quoted."""
    words = []
    for arg in argv:
        text = str(arg).replace("%", "%%").replace("$", "$$")
        if re.fullmatch(r"[A-Za-z0-9_@%+=:,./^-]+", text):
            words.append(text)
        else:
            words.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return " ".join(words)


def environment(params: dict) -> dict:
    """The service's (non-secret) environment: caches under the state directory, offline hub, no usage stats."""
    state = params["state_dir"]
    env = {"HOME": state, "HF_HOME": f"{state}/hf", "VLLM_CACHE_ROOT": f"{state}/cache", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", "XDG_CACHE_HOME": f"{state}/cache"}
    if params.get("hf_offline", True):
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    env.update(check_env(params))
    return dict(sorted(env.items()))


def render_envfile(env: dict, header: str) -> str:
    lines = [header]
    for key, value in sorted(env.items()):
        lines.append(f"{key}={value}" if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]*", value) else f'{key}="{value}"')
    return "\n".join(lines) + "\n"


def check_unit_settings(params: dict) -> dict:
    settings = params["unit_settings"]
    if not isinstance(settings, dict):
        raise VllmArgsError(f"vllm_service_unit_settings={settings!r}: expected a mapping of systemd [Service] setting: value")
    out = {}
    for key in sorted(settings, key=str):
        value = settings[key]
        if not isinstance(key, str) or not re.fullmatch(r"[A-Z][A-Za-z0-9]+", key):
            raise VllmArgsError(f"vllm_service_unit_settings: {key!r} is not a systemd setting name (CPUAffinity, Nice, ...)")
        if key in UNIT_OWNED:
            raise VllmArgsError(f"vllm_service_unit_settings.{key}: the role writes {key} itself; use the matching "
                                "vllm_service_* variable")
        if isinstance(value, bool):
            value = "yes" if value else "no"
        if value is None or not isinstance(value, (str, int, float)):
            raise VllmArgsError(f"vllm_service_unit_settings.{key}={value!r}: expected a string or a number")
        _no_control(f"unit_settings.{key}", str(value))
        out[key] = str(value)
    return out


def ready_url(host: str, port: int) -> str:
    """Where the host itself reaches the service: loopback for a wildcard address."""
    if host == "0.0.0.0":
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def venv_name(package: str, version: str, source: dict) -> str:
    """<package>-<version>-<hash of everything that decides the venv's content>."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", str(package or "")):
        raise VllmArgsError(f"vllm_service_package={package!r}: not a Python package name")
    if not re.fullmatch(r"[0-9][A-Za-z0-9.+!_-]*", str(version or "")):
        raise VllmArgsError(f"vllm_service_version={version!r}: pin an exact version such as 0.32.0")
    blob = json.dumps({"package": package, "version": version, "source": source}, sort_keys=True, separators=(",", ":"))
    return f"{package}-{version}-{hashlib.sha256(blob.encode('utf-8')).hexdigest()[:12]}"


def build(params: dict) -> dict:
    """Everything the role renders, checked. Raises VllmArgsError."""
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise VllmArgsError(f"unknown vllm_args parameter(s): {', '.join(unknown)}")
    p = dict(DEFAULTS)
    p.update({k: v for k, v in params.items() if v is not None or k in ("enable_chunked_prefill", "enable_prefix_caching")})
    if p["model"] is None:
        raise VllmArgsError("vllm_service_model is not set: set it to the model directory on the host")
    check_api_key(p["api_key"])
    serving = flags(p)
    extra = check_extra_args(p)
    command = check_command(p)
    argv = command + serving + extra
    host, port = check_host(p["host"]), int(p["port"])
    secret_names = check_secret_env(p)
    if not p["api_key"] and not is_loopback(host) and not p["allow_no_api_key"]:
        raise VllmArgsError(f"vllm_service_host={host} serves beyond loopback but vllm_service_api_key is empty: anyone who "
                            "reaches the port could use the model. Set vllm_service_api_key (from Ansible Vault), or listen "
                            "on 127.0.0.1, or set vllm_service_allow_no_api_key: true behind an authenticating proxy.")
    return {
        "argv": argv,
        "exec_start": systemd_quote(argv),
        "served_model_name": served_name(p),
        "model": check_model(p),
        "host": host,
        "port": port,
        "ready_url": ready_url(host, port),
        "unit_settings": check_unit_settings(p),
        "environment": environment(p),
        "uses_vllm": not p["command"],
        "api_key_set": bool(p["api_key"]),
        "secret_env_names": secret_names,
        "secret_file": bool(p["api_key"]) or bool(secret_names),
    }
