"""A config file's YAML, read safely: size, depth and alias-expansion guards, merge keys as the YAML
spec orders them, words YAML would read as booleans kept as written where they name things, and the
line of every value (for messages)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from .names import is_data_name

MAX_ALIASES = 1000  # YAML aliases beyond this are refused (a "billion laughs" guard) ...
MAX_EXPANSION = 100_000  # ... and so are aliases that expand to more values than this (reached through them)
MAX_DEPTH = 100  # nesting levels
MAX_BYTES = 1 << 20  # a config file's size
Location = tuple[Any, ...]


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
            raise HugeNumber(node) from exc


class HugeNumber(yaml.constructor.ConstructorError):
    """An integer of more digits than Python reads (4,300): named by its key once the path is known."""

    def __init__(self, node: Any) -> None:
        super().__init__(None, None, f"the number {shorten(node.value)} is too large ({len(node.value)} digits): "
                         "no setting takes a number this long; give a smaller one", node.start_mark)
        self.node = node


def _path_to(root: Any, target: Any) -> Location:
    """The dotted path of `target` (a node) within the document `root` (() where not found)."""
    stack: list[tuple[Any, Location]] = [(root, ())]
    seen: set[int] = set()
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            stack += [(value, path + (key.value,)) for key, value in node.value]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(item, path + (i,)) for i, item in enumerate(node.value)]
    return ()


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_int)
_Loader.add_constructor(BOOL, _Loader.construct_yaml_bool)


def shorten(text: str, limit: int = 60) -> str:
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
            try:
                data = loader.construct_document(node) if node is not None else None
            except HugeNumber as exc:
                key = ".".join(map(str, _path_to(node, exc.node)))
                exc.problem = f"{key}: {exc.problem}" if key else exc.problem
                raise
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
    if is_data_name(path):
        raise ConfigError(f"{path}: a data table, not a YAML config; a config names it in data.train (see "
                          "configs/*.yaml, or `magmadnn schema`), then: magmadnn train CONFIG")
    data, node = parse_yaml(text, str(path))
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {'list' if isinstance(data, list) else 'single value'}"
        raise ConfigError(f"{path}: expected a mapping of sections (name, data, model, ...), one 'key: value' a "
                          f"line; received {got} (`magmadnn schema` and configs/*.yaml show configs)")
    return data, _line_map(node)


