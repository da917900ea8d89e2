"""horovodrun's --config-file: its YAML layout (section -> key: value) read
into tfring-run's options, for the options the command line left unset.
Without PyYAML, JSON and horovodrun's plain two-level layout are read."""

import argparse
import json

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")


def log_level(text):
    if text.upper() in LOG_LEVELS:
        return text.upper()
    if text in ("0", "1", "2", "3"):  # tfring's own levels
        return ("DEBUG", "INFO", "WARNING", "ERROR")[int(text)]
    raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(LOG_LEVELS)} or 0-3")


# horovodrun's YAML layout: section -> {key: dest}.
_CONFIG = {
    "params": {"fusion_threshold_mb": "fusion_threshold_mb", "cycle_time_ms": "cycle_time_ms",
               "cache_capacity": "cache_capacity",
               "hierarchical_allreduce": "hierarchical_allreduce",
               "hierarchical_allgather": "hierarchical_allgather",
               "torus_allreduce": "torus_allreduce"},
    "autotune": {"enabled": "autotune", "log_file": "autotune_log_file",
                 "warmup_samples": "autotune_warmup_samples",
                 "steps_per_sample": "autotune_steps_per_sample",
                 "bayes_opt_max_samples": "autotune_bayes_opt_max_samples",
                 "gaussian_process_noise": "autotune_gaussian_process_noise"},
    "timeline": {"filename": "timeline_filename", "mark_cycles": "timeline_mark_cycles"},
    "stall_check": {"enabled": "no_stall_check",
                    "warning_time_seconds": "stall_check_warning_time_seconds",
                    "shutdown_time_seconds": "stall_check_shutdown_time_seconds"},
    "library_options": {"mpi_threads_disable": "mpi_threads_disable",
                        "num_nccl_streams": "num_nccl_streams",
                        "thread_affinity": "thread_affinity",
                        "gloo_timeout_seconds": "gloo_timeout_seconds"},
    "logging": {"level": "log_level", "with_timestamp": "log_with_timestamp"},
}


def _read_config(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"--config-file {path}: {e.strerror}") from None
    try:
        import yaml
    except ImportError:
        yaml = None
    if yaml is not None:
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"--config-file {path}: not valid YAML ({e})") from None
    try:
        return json.loads(text)  # JSON is YAML too
    except ValueError:
        pass
    try:
        return _two_level_yaml(text)
    except ValueError as e:
        raise ValueError(
            f"--config-file {path}: {e}; without PyYAML (pip install pyyaml) only "
            "horovodrun's plain layout (section:, then indented key: value lines) or "
            "JSON is read") from None


def _scalar(text):
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    low = t.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("null", "~", ""):
        return None
    for kind in (int, float):
        try:
            return kind(t)
        except ValueError:
            pass
    return t


def _two_level_yaml(text):
    """horovodrun's config layout without PyYAML: top-level ``key: value``
    or ``section:`` followed by indented ``key: value`` lines of scalars."""
    config, section = {}, None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#") or line.strip() == "---":
            continue
        key, sep, value = line.strip().partition(":")
        if not sep or not key or any(c in line for c in "[]{}&*|>"):
            raise ValueError(f"line {lineno} is not 'key: value'")
        if line[0] in " \t":
            if section is None:
                raise ValueError(f"line {lineno} is indented outside a section")
            config[section][key.strip()] = _scalar(value)
        elif value.strip():
            config[key.strip()], section = _scalar(value), None
        else:
            section = key.strip()
            config[section] = {}
    return config


def load_config_file(args):
    """Fills the options left unset on the command line from horovodrun's
    YAML parameter file. Raises ValueError naming a malformed entry."""
    path = args.config_file
    config = _read_config(path)
    if config is None:
        return
    if not isinstance(config, dict):
        raise ValueError(f"--config-file {path}: the top level must be a mapping")
    for section, value in config.items():
        if section == "controller":
            if str(value).lower() not in ("gloo", "mpi"):
                raise ValueError(f"--config-file {path}: no such controller {value!r}")
            if str(value).lower() == "mpi" and not args.use_gloo:
                args.use_mpi = True
            continue
        keys = _CONFIG.get(section)
        if keys is None:
            raise ValueError(f"--config-file {path}: unknown section {section!r} "
                             f"(known: controller, {', '.join(_CONFIG)})")
        if not isinstance(value, dict):
            raise ValueError(f"--config-file {path}: {section} must be a mapping")
        for key, v in value.items():
            dest = keys.get(key)
            if dest is None:
                raise ValueError(f"--config-file {path}: unknown key {section}.{key}")
            if (section, key) == ("stall_check", "enabled"):
                v = not v
            if (section, key) == ("logging", "level"):
                v = log_level(str(v))
            if getattr(args, dest, None) is None:
                setattr(args, dest, v)
