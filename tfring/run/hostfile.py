"""Host files as horovodrun and Open MPI's mpirun read them.

    # comment
    node1 slots=4                 Horovod's and Open MPI's format
    node2 slots=4 max_slots=8     Open MPI: max_slots is accepted
    node3:2                       the -H form, one host a line
    node4                         one slot

Blank lines and ``#`` comments (whole-line or trailing) are skipped. A host
named twice gets the slots of both lines (as with ``-H``). ``max_slots``
bounds oversubscription in Open MPI; tfring-run fills ``slots`` only, so it
is checked and otherwise unused. Open MPI also takes ``count=`` and
``cpu=`` for ``slots=``; so does this parser.
"""

__all__ = ["parse_hostfile", "parse_hostfile_text"]

_SLOTS_KEYS = ("slots", "count", "cpu")
_MAX_KEYS = ("max_slots", "max-slots", "slots_max", "slots-max")


def _int_field(text, what, where):
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"{where}: {what} must be an integer, got {text!r}") from None
    if n < 1:
        raise ValueError(f"{where}: {what} must be >= 1, got {n}")
    return n


def _parse_line(line, where):
    fields = line.split()
    host = fields[0]
    slots = max_slots = None
    if "=" in host:
        raise ValueError(f"{where}: a line starts with the host name, got {host!r}")
    if host.count(":") == 1 and not host.startswith("["):  # host:N
        host, n = host.split(":")
        if not host:
            raise ValueError(f"{where}: empty host name")
        slots = _int_field(n, "slots", where)
    elif host.startswith("["):  # [v6] or [v6]:N
        end = host.find("]")
        if end < 0:
            raise ValueError(f"{where}: unterminated '[' in {host!r}")
        rest = host[end + 1:]
        host = host[1:end]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{where}: bad host entry {fields[0]!r}")
            slots = _int_field(rest[1:], "slots", where)
    for field in fields[1:]:
        key, sep, value = field.partition("=")
        key = key.lower()
        if not sep:
            raise ValueError(f"{where}: expected key=value after the host name, got {field!r}")
        if key in _SLOTS_KEYS:
            if slots is not None:
                raise ValueError(f"{where}: slots given twice")
            slots = _int_field(value, key, where)
        elif key in _MAX_KEYS:
            max_slots = _int_field(value, key, where)
        else:
            raise ValueError(f"{where}: unknown field {key!r} (expected slots=N, "
                             "optionally max_slots=M)")
    if slots is None:
        slots = 1
    if max_slots is not None and max_slots < slots:
        raise ValueError(f"{where}: max_slots={max_slots} is less than slots={slots}")
    return host, slots


def parse_hostfile_text(text, name="<hostfile>"):
    """The host file's text -> [(host, slots), ...]. Raises ValueError
    naming the file and line of the first malformed entry."""
    hosts = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        hosts.append(_parse_line(line, f"{name}:{lineno}"))
    if not hosts:
        raise ValueError(f"{name}: no hosts (only blank lines and comments)")
    return hosts


def parse_hostfile(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"cannot read host file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"host file {path} is not text") from None
    return parse_hostfile_text(text, path)
