"""The CEL parser: cel-python's lark grammar with what cel-go's grammar has beyond it (optional
selection ``a.?b`` and ``a[?b]``, optional entries ``[?x]`` and ``{?k: v}``, trailing commas in list
and map literals), and its LALR tables from a per-user cache, so that a CLI process does not rebuild
them at every start (about 90 ms of a `review`; loading them takes about 10).

The cache is JSON, never pickle: loading JSON runs no code, whereas a pickle (lark's own cache
format) is a program, and a cache directory shared or left writable by others would run it in
every CLI process of this user. A file is used only when it is a regular file owned by the user
and writable by no one else, in such a directory, and carries the key of what the tables are made
from (lark's version, cel-python's grammar and parser options, this format); anything else, a
corrupt file included, is ignored and the tables are rebuilt and written again.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import lark
from celpy import celparser
from lark.grammar import Rule
from lark.lexer import TerminalDef
from lark.parsers.lalr_analysis import IntParseTable, ParseTable
from lark.utils import SerializeMemoizer

FORMAT = 2  # of the file below: a new layout changes the key
MAX_BYTES = 4 << 20  # the tables are about 100 KB; a bigger file is not ours
# Options that are objects (callbacks, classes): not serialised, given again when loading.
_OBJECT_OPTIONS = frozenset({"lexer_callbacks", "tree_class", "postlex", "transformer", "_plugins"})


def cache_dir() -> Path | None:
    """$XDG_CACHE_HOME/trainjob-admission, by default ~/.cache/trainjob-admission; None without a
    home directory (a relative XDG_CACHE_HOME is ignored, as the XDG spec says)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(base):
        return Path(base) / "trainjob-admission"
    try:
        return Path.home() / ".cache" / "trainjob-admission"
    except RuntimeError:  # no HOME and no password entry
        return None


# cel-go's grammar (github.com/google/cel-go@v0.26.0 parser/gen/CEL.g4) beyond cel-python's: each
# rule of cel.lark on the left is replaced by the text on the right (the rule itself, extended). An
# expression cel-python's grammar parses gets the very tree it gets there.
EXTENSIONS = (
    ("member         : member_dot | member_dot_arg | member_index | member_object | primary",
     "member         : member_dot | member_dot_arg | member_index | member_object | primary\n"
     "               | member_dot_opt | member_index_opt\n"
     'member_dot_opt : member "." "?" IDENT\n'
     'member_index_opt : member "[" "?" expr "]"'),
    ('list_lit       : "[" [exprlist] "]"', 'list_lit       : "[" [exprlist] "]" | "[" "," "]"'),
    ('map_lit        : "{" [mapinits] "}"', 'map_lit        : "{" [mapinits] "}" | "{" "," "}"'),
    # left-recursive and inlined (``_``), so that the children of exprlist and mapinits are
    # cel-python's (expr, expr, ... and key, value, key, value, ...), with a trailing_comma last
    # when there is one (ast.py refuses it in a call, as cel-go's grammar does)
    ('exprlist       : expr ("," expr)*',
     "exprlist       : _exprs | _exprs trailing_comma\n"
     '_exprs         : _element | _exprs "," _element\n'
     "_element       : expr | optional_element\n"
     'optional_element : "?" expr\n'
     'trailing_comma : ","'),
    ('mapinits       : expr ":" expr ("," expr ":" expr)*',
     "mapinits       : _inits | _inits trailing_comma\n"
     '_inits         : _element ":" expr | _inits "," _element ":" expr'),
)
PARSER: lark.Lark | None = None  # the one parser of this process (see parser())


def grammar() -> str:
    """cel-python's grammar with EXTENSIONS; a rule they expect that is not there is an error (a
    new cel-python changed its grammar: look at the extensions again)."""
    text = Path(celparser.__file__).with_name("cel.lark").read_text()
    for rule, extended in EXTENSIONS:
        if rule not in text:
            raise RuntimeError(f"cel-python's grammar has no rule {rule!r} to extend")
        text = text.replace(rule, extended)
    return text


def build() -> lark.Lark:
    """The parser from the grammar, with cel-python's parser options (celparser.CELParser)."""
    return lark.Lark(grammar(), parser="lalr", start="expr", debug=True, g_regex_flags=re.M,
                     lexer_callbacks={"IDENT": celparser.CELParser.ambiguous_literals}, propagate_positions=True,
                     maybe_placeholders=False, priority="invert", tree_class=lark.Tree)


def parser() -> lark.Lark:
    """This process's parser: from the cache when one is installed, else built now."""
    if PARSER is None:
        install()
    return PARSER


@lru_cache(maxsize=1)
def key() -> str:
    """What the tables are made from: lark's version, the grammar (cel-python's and its extensions),
    the module that holds cel-python's parser options, and this file's format."""
    digest = hashlib.sha256(f"{FORMAT} lark {lark.__version__}".encode())
    digest.update(grammar().encode())
    digest.update(Path(celparser.__file__).read_bytes())
    return digest.hexdigest()


def install(directory: Path | None = None) -> None:
    """Load the parser from the cache, or build it and write the cache; once per process is enough."""
    global PARSER
    if PARSER is not None:
        return
    directory = directory or cache_dir()
    path = directory / f"cel-parser-{key()[:32]}.json" if directory else None
    loaded = load(path) if path else None
    if loaded is not None:
        PARSER = loaded
        return
    PARSER = build()
    if path:
        save(PARSER, path)


def save(parser: lark.Lark, path: Path) -> None:
    """Write ``parser``'s tables to ``path`` (0600, in a 0700 directory), atomically; a cache that
    cannot be written is no error: the next start builds the tables again."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(path.parent):
            return
        text = json.dumps({"key": key(), "tables": _encode(_tables(parser))}, separators=(",", ":"))
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".cel-parser-")  # 0600
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError:
        pass


def load(path: Path) -> lark.Lark | None:
    """The parser from ``path``, or None when the file is missing, not private to this user, for
    other versions, or not readable as tables."""
    try:
        if not (_private(path.parent) and _private(path, regular=True)):
            return None
        with path.open("rb") as source:
            text = source.read(MAX_BYTES + 1)
        if len(text) > MAX_BYTES:
            return None
        cached = json.loads(text, object_hook=_decode)
        if not isinstance(cached, dict) or cached.get("key") != key():
            return None
        return lark.Lark.__new__(lark.Lark)._load(cached["tables"], tree_class=lark.Tree,
                                                   lexer_callbacks={"IDENT": celparser.CELParser.ambiguous_literals})
    except Exception:  # noqa: BLE001 - whatever is wrong with a cache file, the tables are rebuilt
        return None


def _private(path: Path, regular: bool = False) -> bool:
    """``path`` (not followed if a symlink) is this user's and writable by no one else."""
    info = path.lstat()
    kind = stat.S_ISREG(info.st_mode) if regular else stat.S_ISDIR(info.st_mode)
    return kind and info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _tables(parser: lark.Lark) -> dict[str, Any]:
    """lark's own serialisation of ``parser`` (as ``Lark.save`` makes it), its parse table keyed
    by state numbers (cel-python asks for debug tables, keyed by item sets) and without the
    options that are objects."""
    memo = SerializeMemoizer([TerminalDef, Rule])
    data = parser.serialize(memo)
    table = parser.parser.parser._parse_table
    if isinstance(table, ParseTable):
        data["parser"]["parser"] = IntParseTable.from_ParseTable(table).serialize(memo)
    data["options"] = {name: value for name, value in data["options"].items() if name not in _OBJECT_OPTIONS}
    return {"data": data, "memo": memo.serialize()}


def _encode(value: Any) -> Any:
    """JSON for lark's serialisation: tuples become lists (lark reads either), a dict with keys
    that are not strings becomes {"__items__": [[key, value], ...]}."""
    if isinstance(value, dict):
        if all(isinstance(name, str) for name in value):
            return {name: _encode(item) for name, item in value.items()}
        return {"__items__": [[name, _encode(item)] for name, item in value.items()]}
    if isinstance(value, (list, tuple)):
        return [_encode(item) for item in value]
    if value is None or isinstance(value, (str, int, float)):
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else value  # re.M is an int
    raise TypeError(f"cannot cache a {type(value).__name__}")


def _decode(value: dict) -> dict:
    return dict(value["__items__"]) if set(value) == {"__items__"} else value
