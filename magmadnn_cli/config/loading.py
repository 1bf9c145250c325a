"""Reading a config: safe YAML with line numbers, `--set` overrides, validation, and error messages
that name the file, the line, the dotted path, what was expected and what was received."""

from __future__ import annotations

import difflib
import re
import os
import secrets
from pathlib import Path
from typing import Any, Callable, Sequence, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from .schema import Config
from ..errors import ConfigError

PATH_FIELDS = (("data", "train"), ("data", "validation"), ("data", "test"))
MAX_ALIASES = 1000  # YAML aliases beyond this are refused (a "billion laughs" guard) ...
MAX_EXPANSION = 100_000  # ... and so are aliases that expand to more values than this (reached through them)
MAX_DEPTH = 100  # nesting levels
MAX_BYTES = 1 << 20  # a config file's size
Location = tuple[Any, ...]
Check = Callable[[Config], list[tuple[Location, str]]]  # a valid config -> (path, problem) of what it cannot run


MERGE, STR, BOOL = "tag:yaml.org,2002:merge", "tag:yaml.org,2002:str", "tag:yaml.org,2002:bool"


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses duplicate keys, alias bombs, deep nesting and huge integers, and
    takes YAML merge keys (`<<: *defaults`) in the order the YAML merge spec gives. Keys are names, so a
    key YAML 1.1 reads as a boolean (yes, no, on, off, true, false) stays the word written; so do
    the labels of `label_map` (and, with `labels`, every such word: a --set inside label_map)."""

    aliases = 0
    depth = 0
    labels = False

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.MarkedYAMLError("while reading the config", None,
                                           f"more than {MAX_ALIASES} YAML aliases (an alias bomb?)",
                                           self.peek_event().start_mark)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.MarkedYAMLError("while reading the config", None,
                                           f"nested more than {MAX_DEPTH} levels deep; a config needs a few",
                                           self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def flatten_mapping(self, node: Any, merging: frozenset[int] = frozenset()) -> None:
        """Merge keys as the YAML merge spec orders them: the mapping's own keys first, then each merged
        mapping in list order (`<<: [*b, *a]` takes a key in both from b). PyYAML 6.0.x keeps a key
        met twice from the later mapping."""
        own, merged = [], []
        for key_node, value_node in node.value:
            if key_node.tag != MERGE:
                if key_node.tag == "tag:yaml.org,2002:value":  # a plain `=` key: a name, as PyYAML has it
                    key_node.tag = STR
                own.append((key_node, value_node))
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source in sources:
                if not isinstance(source, yaml.MappingNode) or id(source) in merging | {id(node)}:
                    what = "the mapping itself" if isinstance(source, yaml.MappingNode) else f"a {source.id}"
                    raise yaml.constructor.ConstructorError("while merging", node.start_mark, "`<<` merges "
                                                            f"mappings; found {what}", source.start_mark)
                self.flatten_mapping(source, merging | {id(node)})
                merged += source.value
        if merged:
            taken = {self._key_identity(k) for k, _ in own}
            first = []
            for key_node, value_node in merged:
                if self._key_identity(key_node) not in taken:
                    taken.add(self._key_identity(key_node))
                    first.append((key_node, value_node))
            node.value = first + own

    def _key_identity(self, key_node: Any) -> Any:
        if isinstance(key_node, yaml.ScalarNode):
            self._spell_boolean(key_node)
            key = self.construct_object(key_node)
            return ("key", key) if isinstance(key, (str, int, float, bool, type(None))) else id(key_node)
        return id(key_node)

    def _spell_boolean(self, node: Any) -> None:
        """A plain scalar YAML 1.1 reads as a boolean becomes the word written (a name or label)."""
        if isinstance(node, yaml.ScalarNode) and node.tag == BOOL and node.style is None:
            node.tag = STR

    def construct_yaml_bool(self, node: Any) -> Any:
        return node.value if self.labels and node.style is None else super().construct_yaml_bool(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        self.flatten_mapping(node)
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            self._spell_boolean(key_node)
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == "label_map" and \
                    isinstance(value_node, yaml.MappingNode):
                for label_node, new_node in value_node.value:
                    self._spell_boolean(label_node)
                    self._spell_boolean(new_node)
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(None, None, "a key must be a name, not a list or mapping",
                                                        key_node.start_mark) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_int(self, node: Any) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError as exc:
            raise yaml.constructor.ConstructorError(None, None, f"the number {_shorten(node.value)} is too large "
                                                    f"({len(node.value)} digits)", node.start_mark) from exc


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_int)
_Loader.add_constructor(BOOL, _Loader.construct_yaml_bool)


def _shorten(text: str, limit: int = 60) -> str:
    """User text in a message: at most `limit` characters."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 4:]} ({len(text):,} characters)"


def _not_a_config(raw: bytes) -> str:
    """What a file that is not UTF-8 text looks like, for the message."""
    if raw[:2] == b"PK":
        return "a zip or .npz file (a model file? `magmadnn evaluate` and `predict` take one)"
    return "a gzip file" if raw[:2] == b"\x1f\x8b" else "not UTF-8 text"


def parse_yaml(text: str, origin: str, labels: bool = False) -> tuple[Any, Any]:
    """YAML text -> (data, its root node), through the guarded loader; errors name `origin` and line.
    `labels`: words YAML 1.1 reads as booleans stay words (a value inside data.label_map)."""
    try:
        loader = _Loader(text)
        loader.labels = labels
        try:
            node = loader.get_single_node()
            expansion = _alias_expansion(node) if node is not None else 0
            if expansion > MAX_EXPANSION:
                raise ConfigError(f"{origin}: the YAML's aliases expand to {expansion:,} values beyond those written "
                                  f"(more than {MAX_EXPANSION:,}: an alias bomb?); refused")
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except RecursionError as exc:
        raise ConfigError(f"{origin}: anchors and aliases nest too deeply (through merges or aliases of "
                          "aliases); refused") from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        if "could not determine a constructor" in str(problem):
            problem = f"{problem}; tags that build Python objects are not allowed"
        fix = "" if origin.startswith("--set") else _syntax_fix(exc, text)  # --set: the origin shows the text
        raise ConfigError(f"{origin}{line}: {problem}{fix}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: invalid YAML: {exc}") from exc
    return data, node


def _syntax_fix(exc: yaml.MarkedYAMLError, text: str) -> str:
    """The offending line as written and the likely fix of a YAML syntax error ('' for others)."""
    problem, context = str(exc.problem or ""), str(exc.context or "")
    opened = exc.context_mark.line + 1 if exc.context_mark else None
    if "quoted scalar" in context:
        fix = f"the quote opened on line {opened} is not closed"
    elif "flow mapping" in context or "flow sequence" in context:
        bracket = "{" if "mapping" in context else "["
        fix = f"the {bracket} opened on line {opened} lacks a ',' between two entries, or is not closed"
    elif "'\\t'" in problem:
        fix = "YAML indents with spaces, not tabs: replace the tab"
    elif "mapping values are not allowed" in problem:
        fix = "a key indented deeper than the key above it, or a value holding ': ' (quote the value)"
    elif "could not find expected ':'" in problem:
        fix = "a line that is not `key: value` (a missing ': ', or an unclosed quote above it)"
    elif exc.problem_mark is None or isinstance(exc, yaml.constructor.ConstructorError) or "constructor" in problem:
        return ""
    else:
        fix = "check this line's indentation and quotes"
    lines, number = text.splitlines(), exc.problem_mark.line + 1 if exc.problem_mark else 0
    shown = f"\nline {number}: {lines[number - 1][:100]!r}" if 0 < number <= len(lines) else ""
    return f"{shown}\nfix: {fix}"


def _alias_expansion(root: Any) -> int:
    """How many values the document gains when its aliases are expanded: every value counted as often
    as it is reached, less the values written (so a long plain document counts nothing). Iterative
    and memoized: a billion laughs is counted, never expanded."""
    size: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else \
            node.value if isinstance(node, yaml.SequenceNode) else []
        if children_done:
            size[id(node)] = 1 + sum(size[id(c)] for c in children)
        elif id(node) not in size:
            size[id(node)] = 0  # until counted; a recursive alias counts as nothing more
            stack.append((node, True))
            stack += [(c, False) for c in children if id(c) not in size]
    return size[id(root)] - len(size)


def _line_map(node: Any, path: Location = (), lines: dict[Location, int] | None = None,
              seen: set[int] | None = None) -> dict[Location, int]:
    """Dotted path -> 1-based YAML line, for every key and list item (aliased nodes walked once)."""
    lines = {} if lines is None else lines
    seen = set() if seen is None else seen
    lines.setdefault(path, node.start_mark.line + 1)
    if id(node) in seen:
        return lines
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            lines[path + (key.value,)] = key.start_mark.line + 1
            _line_map(value, path + (key.value,), lines, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, path + (i,), lines, seen)
    return lines


def read_yaml(path: Path) -> tuple[dict, dict[Location, int]]:
    """The document as plain data, and its line map. Errors become ConfigError with file:line."""
    if not path.exists():
        raise ConfigError(f"{path}: config file not found")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; expected a YAML config file")
    try:
        with open(path, "rb") as f:  # read once (a pipe works too), and never without bound
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_BYTES // 2**20} MiB; a config is a few kB (is this the "
                              "right file?)")
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: {_not_a_config(raw)}, not a YAML config (UTF-8 text: name, data, model, ...)"
                          ) from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror or exc}") from exc
    data, node = parse_yaml(text, str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (name, data, model, ...); "
                          f"received {type(data).__name__}")
    return data, _line_map(node)


def parse_override(text: str) -> tuple[Location, Any]:
    """`model.layers.0.units=64` -> (("model", "layers", 0, "units"), 64); values are YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {_shorten(text)!r}: expected dotted.key=value, e.g. --set training.epochs=20")
    if raw.strip() in ("", "-"):  # `data.train=-`: stdin (in YAML a lone `-` would be a list)
        value: Any = raw.strip()
    else:
        value = parse_yaml(raw, f"--set {_shorten(text)}", labels="label_map" in key.split("."))[0]
    path = tuple(int(p) if p.isdigit() else p for p in key.strip().split("."))
    return path, value


def apply_override(data: dict, path: Location, value: Any, origin: str) -> None:
    node: Any = data
    for i, part in enumerate(path[:-1]):
        where = ".".join(map(str, path[:i + 1]))
        if isinstance(node, list):
            if not isinstance(part, int) or part >= len(node):
                raise ConfigError(f"{origin}: {where}: no list item {part} (the list has {len(node)})")
            node = node[part]
        elif isinstance(node, dict):
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
        else:
            raise ConfigError(f"{origin}: {where}: cannot set a key inside a {type(node).__name__}")
    last = path[-1]
    if isinstance(node, list):
        if not isinstance(last, int) or last > len(node):
            raise ConfigError(f"{origin}: no list item {last} (the list has {len(node)})")
        node[last:last + 1] = [value]
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"{origin}: cannot set {last!r} inside a {type(node).__name__}")


def load_config(path: Path | str, overrides: list[str] | tuple[str, ...] = (), draw_seed: bool = True,
                checks: Sequence[Check] = ()) -> Config:
    """Read, override, resolve paths, validate, then run `checks` (the runtime's, which the config
    cannot import: e.g. what the distributed strategy supports), their problems located like the
    schema's; a seed is drawn if the config has none (and `draw_seed`)."""
    path = Path(path)
    data, lines = read_yaml(path)
    origins: dict[Location, str] = {}
    for text in overrides:
        key, value = parse_override(text)
        apply_override(data, key, value, f"--set {text}")
        origins[key] = f"--set {text}"
    data.setdefault("name", re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem).lstrip(".-")[:100] or "run")
    written = _resolve_paths(data, path.parent, origins)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, data, path, lines, origins)) from exc
    problems = [problem for check in checks for problem in check(config)]
    if problems:
        raise ConfigError(format_problems(problems, path, lines, origins))
    for key, text in written.items():
        _check_data_file(key, text, Path(data[key[0]][key[1]]), _where(key, path, lines, origins),
                         None if key in origins else path.resolve().parent)
    if config.seed is None and draw_seed:
        config = config.model_copy(update={"seed": secrets.randbelow(2**31)})
    return config


def _resolve_paths(data: dict, base: Path, origins: dict[Location, str]) -> dict[Location, str]:
    """Data paths, `~` and `$VARS` expanded, made absolute: those from the file relative to the file,
    those from --set relative to the working directory. Absolute, so the config a run writes trains
    again from any directory. Returns each resolved path's text as written."""
    written = {}
    for key in PATH_FIELDS:
        section = data.get(key[0])
        if isinstance(section, dict) and isinstance(section.get(key[1]), str) and section[key[1]] != "-":
            written[key] = section[key[1]]
            p = Path(os.path.expandvars(section[key[1]])).expanduser()
            start = Path.cwd() if key in origins else base
            section[key[1]] = os.path.abspath(p if p.is_absolute() else start / p)
    return written


def _check_data_file(key: Location, text: str, resolved: Path, where: str, config_dir: Path | None) -> None:
    """A data path that names nothing: where it was given, the rule it was resolved by, and the file
    the user probably meant when the same text names one from the working directory."""
    if resolved.exists():
        return
    dotted = ".".join(map(str, key))
    if config_dir is None:
        raise ConfigError(f"{where}: {dotted}: {text} not found ({resolved}; a path given with --set is relative "
                          "to the working directory)")
    message = (f"{where}: {dotted}: {text} not found: {resolved} (paths in a config file are relative to the "
               f"config file's folder, {config_dir})")
    here = Path(os.path.expandvars(text)).expanduser().absolute()
    if not Path(text).is_absolute() and here.exists():
        message += (f". {here} exists in the working directory: write {dotted}: "
                    f"{os.path.relpath(here, config_dir)} (relative to the config file) or the absolute path")
    raise ConfigError(message)


# -- error messages ------------------------------------------------------------------------------
def _data_path(data: Any, loc: Location) -> Location:
    """pydantic's loc with union tags and wrapper names removed: the path in the user's data."""
    path: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            path.append(part)
            node = node[part]
        elif isinstance(part, str) and not (isinstance(node, dict) and part in node) and \
                ((isinstance(node, dict) and node.get("type") == part) or part in ("str", "function-after", "literal")
                 or "[" in part):
            continue  # a discriminator tag or a union member name
        else:
            path.append(part)
            node = None
    return tuple(path)


def _where(path: Location, file: Path, lines: dict[Location, int], origins: dict[Location, str]) -> str:
    """A --set that replaced the path or a section above it; for a section's own check, the --set
    given inside it (with the section's line when the file has it); else the file line of the path's
    nearest part; for a problem of the whole config, the file plus every --set given."""
    for i in range(len(path), 0, -1):
        if path[:i] in origins:
            return origins[path[:i]]
    if not path and origins:
        return f"{file} with " + ", ".join(origins.values())
    below = [origin for key, origin in origins.items() if key[:len(path)] == path]  # a section's check
    if below:
        return (f"{file}:{lines[path]} with " if path in lines else "") + ", ".join(below)
    for i in range(len(path), -1, -1):
        if path[:i] in lines:
            return f"{file}:{lines[path[:i]]}"
    return str(file)


def _pick(annotation: Any, node: Any) -> Any:
    """The BaseModel member of an annotation (unwrapping Optional/Annotated/Union by `type` tag)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _pick(arg, node)
        if found is not None:
            if isinstance(node, dict) and "type" in found.model_fields and \
                    node.get("type") not in get_args(found.model_fields["type"].annotation):
                continue
            return found
    return None


def _model_at(data: Any, path: Location) -> type[BaseModel] | None:
    """The pydantic model class that validates the mapping at `path` (list items included)."""
    cls: Any = Config
    node = data
    for part in path:
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and part < len(node) else None
            cls = _pick(cls, node)
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or part not in cls.model_fields:
            return None
        annotation = cls.model_fields[part].annotation
        node = node.get(part) if isinstance(node, dict) else None
        cls = get_args(annotation)[0] if get_origin(annotation) is list else _pick(annotation, node)
    cls = _pick(cls, node) if not (isinstance(cls, type) and issubclass(cls, BaseModel)) else cls
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _suggest(word: Any, choices: list[str]) -> str:
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    return f"\n  did you mean {close[0]!r}?" if close else ""


def _describe(error: dict, data: Any, path: Location) -> tuple[str, str]:
    """(what is wrong, extra lines: expected / received / suggestion)."""
    kind, ctx = error["type"], error.get("ctx", {})
    received = error.get("input")
    if kind == "extra_forbidden":
        model = _model_at(data, path[:-1])
        allowed = sorted(model.model_fields) if model else []
        hint = f"\n  expected one of: {', '.join(allowed)}" if allowed else ""
        return f"unknown key {path[-1]!r}", hint + _suggest(path[-1], allowed)
    if kind == "union_tag_invalid":
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
        return (f"unknown type {ctx.get('tag')!r}",
                f"\n  expected one of: {', '.join(expected)}" + _suggest(ctx.get("tag"), expected))
    if kind == "union_tag_not_found":
        return "missing key 'type'", f"\n  expected a mapping with type: one of the {path[-1] if path else ''} kinds"
    if kind == "missing":
        return f"missing required key {path[-1]!r}" if path else "missing value", ""
    if kind == "literal_error":
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return "invalid value", (f"\n  expected one of: {', '.join(expected)}\n  received: {_shorten(repr(received))}"
                                 + _suggest(received, expected))
    if kind == "string_pattern_mismatch" and path and path[-1] == "name":
        return "not a safe name", (f"\n  expected letters, digits, _ . - (not starting with . or -), at most 100; "
                                   f"it names a folder\n  received: {_shorten(repr(received))}")
    message = _shorten(error["msg"].removeprefix("Value error, ").replace("Input should be", "expected"), 400)
    extra = "" if kind == "value_error" else f"\n  received: {_shorten(repr(received))}"
    return message, extra


SHAPE_MISMATCHES = ("model_type", "dict_type", "model_attributes_type", "list_type")


def _other_member(error: dict[str, Any], path: Location, paths: list[Location]) -> bool:
    """A union member's complaint that the value has the wrong shape ('expected a mapping' for a
    string, 'invalid value' for a mapping) when another member reports on the same value."""
    siblings = sum(1 for q in paths if q[:len(path)] == path) > 1
    wrong_shape = error["type"] in SHAPE_MISMATCHES or (error["type"] == "literal_error"
                                                        and isinstance(error.get("input"), (dict, list)))
    return siblings and wrong_shape


def format_problems(problems: list[tuple[Location, str]], file: Path, lines: dict[Location, int],
                    origins: dict[Location, str]) -> str:
    """Problems of a valid config (`load_config`'s checks), each located and worded as the schema's."""
    blocks = list(dict.fromkeys(f"{_where(p, file, lines, origins)}: {'.'.join(map(str, p)) or '(top level)'}: {what}"
                                for p, what in problems))
    return _invalid(blocks)


def _invalid(blocks: list[str]) -> str:
    count = f"{len(blocks)} problem{'s' if len(blocks) > 1 else ''}"
    return f"invalid config ({count}):\n" + "\n".join(blocks)


def format_validation_error(exc: ValidationError, data: Any, file: Path, lines: dict[Location, int],
                            origins: dict[Location, str]) -> str:
    blocks: list[str] = []
    seen: set[str] = set()
    errors = exc.errors()
    paths = [_data_path(data, e["loc"]) for e in errors]
    for error, path in zip(errors, paths):
        if _other_member(error, path, paths):
            continue  # a union's member that does not fit the value's shape, beside the one that does
        if error["type"] == "missing" and error["loc"] and error["loc"][-1] not in path:
            path = path + (error["loc"][-1],)
        what, extra = _describe(error, data, path)
        dotted = ".".join(map(str, path)) or "(top level)"
        block = f"{_where(path, file, lines, origins)}: {dotted}: {what}{extra}"
        if block not in seen:
            seen.add(block)
            blocks.append(block)
    return _invalid(blocks)
